"""A plain `tritonserver` (default model-control mode, no stoke) serves triton_repo/ as it is.

In the default mode Triton treats every folder of the repository as a model. A data
folder inside it (profiles/ used to be there) makes the server fail with "Poll failed
for model directory"; the second test shows the check catches exactly that.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from processes import stop_process
from triton_helpers import DEMO_REPO, OUTPUT_SHAPES, REPO_MODELS, infer

from agents.triton import find_tritonserver, free_ports, prepare_backend_dir, triton_env

pytestmark = pytest.mark.triton


@contextmanager
def plain_triton(repo: Path, workdir: Path, timeout_s: float = 90.0) -> Iterator[tuple[subprocess.Popen, str, str]]:
    """tritonserver with no --model-control-mode (so: load every model at start); yields (proc, http, grpc).
    Ports free when picked can be taken before Triton binds them (another process's outbound connection):
    a start that exits saying so is tried again on new ports, as `agents.triton.process` does."""
    for _attempt in range(3):
        http, grpc, metrics = free_ports(3)
        proc = _start(repo, workdir, http, grpc, metrics)
        try:
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=1) as reply:
                        if reply.status == 200:
                            break
                except (urllib.error.URLError, OSError):
                    pass
                time.sleep(0.1)
            log = (workdir / "triton.log").read_text(errors="replace").lower()
            if proc.poll() is not None and "already in use" in log:  # 2.51: "Socket '...' already in use"
                continue
            yield proc, f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}"
            return
        finally:
            stop_process(proc, timeout_s=20)
    raise AssertionError("tritonserver found its ports taken on three tries")


def _start(repo: Path, workdir: Path, http: int, grpc: int, metrics: int) -> subprocess.Popen:
    cmd = [
        str(find_tritonserver()),
        f"--model-repository={repo}",
        f"--backend-directory={prepare_backend_dir(workdir)}",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        "--allow-gpu-metrics=false",
        "--pinned-memory-pool-byte-size=0",
        "--exit-timeout-secs=5",
    ]
    with open(workdir / "triton.log", "wb") as log:
        return subprocess.Popen(cmd, env=triton_env(), stdout=log, stderr=subprocess.STDOUT, cwd=workdir)


def _index(http: str) -> dict[str, str]:
    req = urllib.request.Request(f"{http}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=5) as reply:
        return {m["name"]: m.get("state", "") for m in json.load(reply)}


def test_plain_triton_in_default_mode_loads_every_repo_model(tmp_path: Path):
    assert sorted(p.name for p in DEMO_REPO.iterdir() if p.is_dir()) == sorted(REPO_MODELS)
    with plain_triton(DEMO_REPO, tmp_path) as (proc, http, grpc):
        log = (tmp_path / "triton.log").read_text(errors="replace")
        assert proc.poll() is None, f"tritonserver exited with {proc.returncode}: {log[-2000:]}"
        assert _index(http) == {m: "READY" for m in REPO_MODELS}
        for model in REPO_MODELS:
            assert infer(grpc, model, batch=2).shape == (2, *OUTPUT_SHAPES[model])
    assert "Poll failed" not in log and "failed to load" not in log.lower()


def test_a_data_folder_in_the_repository_breaks_plain_triton(tmp_path: Path):
    repo = tmp_path / "repo"
    shutil.copytree(DEMO_REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "profiles").mkdir()
    (repo / "profiles" / "cpu-profile.json").write_text("{}\n")
    with plain_triton(repo, tmp_path, timeout_s=60) as (proc, _http, _grpc):
        proc.wait(timeout=60)
    assert proc.returncode != 0
    assert "Poll failed for model directory 'profiles'" in (tmp_path / "triton.log").read_text(errors="replace")
