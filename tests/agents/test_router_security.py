"""The router is a trust boundary (issue 21, item 1): it forwards inference, health, metadata and statistics,
and refuses Triton's model control over HTTP and gRPC, real Triton on CPU behind the real router.

The attack it stops: Triton's `load` takes files (`file:1/model.py`) and runs them, so whoever reaches a
workload's endpoint could run code in Triton. The last step checks the same load straight to Triton does
run the file, so the refusals above it are refusals of a real attack, not of a request that would fail anyway.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from control_helpers import wait_for
from triton_helpers import DEMO_REPO

from agents.router import Backend, Router, grpc_allowed, http_allowed
from agents.triton import TritonProcess

pytestmark = pytest.mark.triton

EVIL_CONFIG = json.dumps(
    {
        "name": "evil",
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
    }
)


def evil_model(marker: Path) -> bytes:
    """A Python model whose `initialize` writes `marker`: proof that a load ran code."""
    return (
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        f"        open({str(marker)!r}, 'w').write('ran')\n"
        "    def execute(self, requests):\n"
        "        return []\n"
    ).encode()


def http(url: str, method: str = "GET", body: dict | None = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_the_allow_list_units():
    assert http_allowed("POST", "/v2/models/tiny_echo/infer") and http_allowed("GET", "/v2/health/ready")
    assert http_allowed("GET", "/v2/models/tiny_echo/versions/1/stats?x=1") and http_allowed("GET", "/metrics")
    for method, path in [
        ("POST", "/v2/repository/models/tiny_echo/load"),
        ("POST", "/v2/repository/index"),
        ("POST", "/v2/logging"),
        ("GET", "/v2/trace/setting"),
        ("POST", "/v2/models/tiny_echo/trace/setting"),
        ("GET", "/v2/systemsharedmemory/status"),
        ("POST", "/v2/models/../repository/models/x/load"),
        ("POST", "/v2/models/%2e%2e/repository/index"),
        ("POST", "/v2/models/tiny_echo/infer/../../../repository/index"),
        ("GET", "/v2/models/tiny_echo/infer"),  # infer is POST only
        ("DELETE", "/v2/models/tiny_echo"),
    ]:
        assert not http_allowed(method, path), (method, path)
    assert grpc_allowed("/inference.GRPCInferenceService/ModelInfer")
    assert not grpc_allowed("/inference.GRPCInferenceService/RepositoryModelLoad")
    assert not grpc_allowed("/inference.GRPCInferenceService/LogSettings")


def test_model_control_is_refused_over_http_and_grpc_and_inference_still_passes(tmp_path):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    process = TritonProcess(str(DEMO_REPO), workdir=tmp_path / "work")
    process.start()
    router = Router("127.0.0.1")
    try:
        process.load("tiny_echo")
        ep = router.set_backends(
            "echo",
            [
                Backend(
                    "echo#0",
                    process.grpc_url,
                    process.http_url.removeprefix("http://"),
                    f"127.0.0.1:{process.metrics_port}",
                )
            ],
        )
        marker = tmp_path / "ran"
        files = {"file:1/model.py": evil_model(marker)}
        load_body = {
            "parameters": {"config": EVIL_CONFIG, **{k: base64.b64encode(v).decode() for k, v in files.items()}}
        }

        # HTTP: model control refused with 403 and a pointer to what to use instead
        refused = [
            ("POST", "/v2/repository/models/evil/load", load_body),
            ("POST", "/v2/repository/models/tiny_echo/load", {"parameters": {"config": EVIL_CONFIG}}),
            ("POST", "/v2/repository/models/tiny_echo/unload", {}),
            ("POST", "/v2/repository/index", {}),
            ("GET", "/v2/logging", None),
            ("POST", "/v2/logging", {"log_verbose_level": 1}),
            ("GET", "/v2/trace/setting", None),
            ("POST", "/v2/models/tiny_echo/trace/setting", {"trace_level": ["TIMESTAMPS"]}),
            ("GET", "/v2/systemsharedmemory/status", None),
            ("POST", "/v2/models/../repository/index", {}),
            ("POST", "/v2/models/%2e%2e/repository/index", {}),
        ]
        for method, path, body in refused:
            status, text = http(ep.http + path, method, body)
            assert status == 403, (method, path, status, text)
            assert "stoke workload apply" in text and "model control" in text

        # gRPC: PERMISSION_DENIED, the same advice
        client = grpcclient.InferenceServerClient(ep.grpc)
        attempts = [
            lambda: client.load_model("evil", config=EVIL_CONFIG, files=files),
            lambda: client.unload_model("tiny_echo"),
            lambda: client.get_model_repository_index(),
            lambda: client.get_log_settings(),
            lambda: client.update_log_settings({"log_verbose_level": 1}),
            lambda: client.get_trace_settings(),
            lambda: client.update_trace_settings("tiny_echo", {"trace_level": ["TIMESTAMPS"]}),
            lambda: client.get_system_shared_memory_status(),
        ]
        for attempt in attempts:
            with pytest.raises(InferenceServerException) as err:
                attempt()
            assert (
                err.value.status() == "StatusCode.PERMISSION_DENIED" and "stoke workload apply" in err.value.message()
            )

        # what clients need passes, both protocols
        assert client.is_server_live() and client.is_model_ready("tiny_echo")
        assert client.get_model_metadata("tiny_echo").name == "tiny_echo"
        assert client.get_model_config("tiny_echo").config.max_batch_size == 32
        data = np.ones((1, 8), dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT0", [1, 8], "FP32")
        tensor.set_data_from_numpy(data)
        assert client.infer("tiny_echo", [tensor]).as_numpy("OUTPUT0").shape == (1, 8)
        assert client.get_inference_statistics("tiny_echo").model_stats[0].name == "tiny_echo"
        client.close()
        hclient = httpclient.InferenceServerClient(ep.http.removeprefix("http://"))
        assert hclient.is_server_ready() and hclient.get_server_metadata()["name"] == "triton"
        htensor = httpclient.InferInput("INPUT0", [1, 8], "FP32")
        htensor.set_data_from_numpy(data)
        assert hclient.infer("tiny_echo", [htensor]).as_numpy("OUTPUT0").shape == (1, 8)
        assert hclient.get_inference_statistics("tiny_echo")["model_stats"][0]["name"] == "tiny_echo"
        hclient.close()

        # nothing of the attack reached Triton: the served model is untouched and no file ran
        assert process.model_config("tiny_echo").max_batch_size == 32
        assert not marker.exists() and not process.model_ready("evil")

        # the control: the same load straight to Triton's own (loopback) port does run the file
        status, text = http(f"{process.http_url}/v2/repository/models/evil/load", "POST", load_body)
        assert status == 200, text
        wait_for("the file ran inside Triton", marker.exists, timeout=30)
    finally:
        router.close()
        process.stop()
