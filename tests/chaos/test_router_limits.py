"""The router is bounded (issue 21, item 2): a huge declared body, malformed framing and 1,500 idle connections
cost it neither memory nor its other endpoints, and idle connections are closed after the idle timeout.

The router runs in its own process (so its memory is its own) in front of a real Triton on CPU; two workloads
share that Triton, "a" is attacked and "b" (the node's other endpoint) must keep serving.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from triton_helpers import DEMO_REPO

from agents.triton import TritonProcess

pytestmark = [pytest.mark.triton, pytest.mark.chaos]

ROOT = Path(__file__).resolve().parents[2]
IDLE_S = 4.0
ROUTER_SCRIPT = f"""
import json, sys
from agents.router import Backend, Router, RouterLimits
grpc_url, http_url, metrics_url = sys.argv[1:4]
router = Router("127.0.0.1", limits=RouterLimits(idle_timeout_s={IDLE_S}))
backend = Backend("x#0", grpc_url, http_url, metrics_url)
eps = {{w: router.set_backends(w, [backend]) for w in ("a", "b")}}
print(json.dumps({{w: [e.grpc, e.http] for w, e in eps.items()}}), flush=True)
sys.stdin.read()
router.close()
"""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def raw_reply(port: int, head: bytes, send_bytes: int = 0, timeout_s: float = 10.0) -> bytes:
    """Send `head` (and up to `send_bytes` of body, stopping if the router closes), return what it answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(head)
        chunk, sent = b"\0" * 2**20, 0
        try:
            while sent < send_bytes:
                sent += s.send(chunk)
        except OSError:
            pass  # the router closed the connection: what we want
        data = b""
        try:
            while part := s.recv(65536):
                data += part
        except OSError:
            pass
        return data


def infer_ok(grpc_url: str, http_url: str) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    data = np.ones((1, 8), dtype=np.float32)
    g = grpcclient.InferenceServerClient(grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1, 8], "FP32")
    tensor.set_data_from_numpy(data)
    assert g.infer("tiny_echo", [tensor], client_timeout=10).as_numpy("OUTPUT0").shape == (1, 8)
    g.close()
    h = httpclient.InferenceServerClient(http_url.removeprefix("http://"), connection_timeout=10, network_timeout=10)
    htensor = httpclient.InferInput("INPUT0", [1, 8], "FP32")
    htensor.set_data_from_numpy(data)
    assert h.infer("tiny_echo", [htensor]).as_numpy("OUTPUT0").shape == (1, 8)
    h.close()


def test_huge_body_bad_framing_and_idle_connections_harm_nothing(tmp_path):
    process = TritonProcess(str(DEMO_REPO), workdir=tmp_path / "work")
    process.start()
    router = None
    idle: list[socket.socket] = []
    try:
        process.load("tiny_echo")
        router = subprocess.Popen(
            [
                sys.executable,
                "-c",
                ROUTER_SCRIPT,
                process.grpc_url,
                process.http_url.removeprefix("http://"),
                f"127.0.0.1:{process.metrics_port}",
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert router.stdout is not None
        eps = json.loads(router.stdout.readline())
        (a_grpc, a_http), (b_grpc, b_http) = eps["a"], eps["b"]
        a_port = int(a_http.rpartition(":")[2])
        infer_ok(a_grpc, a_http)
        before = rss_mib(router.pid)

        # a 2 GiB declared body, of which we send 64 MiB: refused at once (413), nothing buffered
        t0 = time.monotonic()
        reply = raw_reply(
            a_port,
            b"POST /v2/models/tiny_echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2147483648\r\n\r\n",
            send_bytes=64 * 2**20,
        )
        assert reply[:12] in (b"HTTP/1.1 413", b"HTTP/1.0 413"), reply[:200]
        assert time.monotonic() - t0 < 10
        # malformed framing: 400, not a traceback or a hang
        bad = raw_reply(a_port, b"POST /v2/models/tiny_echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
        assert bad[:12] in (b"HTTP/1.1 400", b"HTTP/1.0 400"), bad[:200]
        two = raw_reply(
            a_port,
            b"POST /v2/models/tiny_echo/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: 4\r\nContent-Length: 9\r\n\r\nabcd",
        )
        assert two[:12] in (b"HTTP/1.1 400", b"HTTP/1.0 400"), two[:200]

        # 1,500 connections that send half a request and then nothing
        for _ in range(1500):
            s = socket.create_connection(("127.0.0.1", a_port), timeout=10)
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
            idle.append(s)
        opened = time.monotonic()
        # the node's other endpoint, and the attacked one itself, still serve, both protocols
        infer_ok(b_grpc, b_http)
        infer_ok(a_grpc, a_http)
        with urllib.request.urlopen(a_http + "/stoke/router/live", timeout=5) as live:
            assert live.status == 200
        grown = rss_mib(router.pid) - before
        assert grown < 150, f"the router grew by {grown:.0f} MiB"

        # and the idle ones are closed by the router after its idle timeout
        closed = 0
        for s in idle:
            s.settimeout(max(0.1, opened + IDLE_S + 10 - time.monotonic()))
            try:
                closed += s.recv(1) == b""
            except TimeoutError:
                pass  # still open: counted as not closed
            except OSError:
                closed += 1  # reset by the router
        assert closed == len(idle), f"{closed} of {len(idle)} idle connections closed"
    finally:
        for s in idle:
            s.close()
        if router is not None:
            router.send_signal(signal.SIGTERM)
            try:
                router.wait(timeout=10)
            except subprocess.TimeoutExpired:
                router.kill()
                router.wait()
        process.stop()
