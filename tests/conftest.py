"""Fixtures shared across the test tree: the demo repository, a moto S3 server, no AWS credentials.

The test folders mirror the packages (tests/foundation, tests/interference, tests/planner, tests/training,
tests/controller, tests/agents, tests/deploy, tests/stoke; tests/chaos); the helper modules beside this file
(triton_helpers, control_helpers, device_fakes, floats, profiles: the synthetic device profiles) are importable
from all of them, since pytest puts this folder on sys.path for its conftest.

Floats: never compare a computed float for exact equality with a value computed elsewhere (a bundled profile,
a literal worked out by hand, another formula). A refit's digits follow the CPU's BLAS and LAPACK kernels and
how far scipy's least-squares solver converged (relative differences from 1e-8 up to 2e-6 measured between
machines against the bundled V100 profile), so compare with a tolerance that still catches a real change:
rel 1e-4 for refitted profiles (floats.assert_close for nested profiles and JSON: a list of coefficients is
one vector, held to its largest entry), pytest.approx(rel=1e-6) for one number from a closed formula. Exact
equality stays right for values carried unchanged (a configured 4.0 read back, a round trip through a file)
and for the same computation run twice on the same input in one process (a determinism check).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from processes import stop_process
from triton_helpers import DEMO_REPO, free_port


@pytest.fixture
def demo_repo_copy(tmp_path: Path) -> Path:
    """A private copy of the demo repository (tests may rewrite its configs)."""
    target = tmp_path / "repo"
    shutil.copytree(DEMO_REPO, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


@pytest.fixture(scope="module")
def moto_server(tmp_path_factory: pytest.TempPathFactory):
    """A real moto S3 server on loopback; yields its endpoint URL and sets fake AWS credentials."""
    binary = Path(sys.executable).parent / "moto_server"
    if not binary.exists():
        pytest.skip("moto_server not installed (pip install 'moto[server]')")
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")
    proc = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=1)
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        stop_process(proc)
        log.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: Environment variables through which botocore's credential chain finds credentials without a file: keys,
#: a profile's name, web identity (EKS IRSA), the container endpoint (ECS, CodeBuild), the old EC2 file.
AWS_CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_CREDENTIAL_EXPIRATION",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_CREDENTIAL_FILE",
)


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AWS credentials anywhere boto3 looks, also on a CI runner or cloud machine that has some."""
    for name in AWS_CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "BOTO_CONFIG"):  # not ~/.aws, ~/.boto
        monkeypatch.setenv(name, str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata lookup (a network wait)
    monkeypatch.setattr("boto3.DEFAULT_SESSION", None)  # a session made earlier keeps the credentials it found
