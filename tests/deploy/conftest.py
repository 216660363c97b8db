"""Fixtures of the Kubernetes tests: the API mock server, a real controller, the operator as a real process."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from chaos.chaos_helpers import Cluster, Proc, free_port
from kube_mock import MockKubernetes


@pytest.fixture(scope="module")
def kube() -> Iterator[MockKubernetes]:
    mock = MockKubernetes()
    try:
        yield mock
    finally:
        mock.close()
    assert not mock.serving(), "the Kubernetes API mock server did not stop"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One controller for the module (each process start costs seconds on a loaded 2-core machine)."""
    c = Cluster(tmp_path_factory.mktemp("k8s"))
    try:
        c.controller()
        yield c
    finally:
        c.close()


class Operator:
    """`stoke k8s operator` against the mock API and the cluster's controller; restartable."""

    def __init__(self, cluster: Cluster, kube: MockKubernetes) -> None:
        self.cluster = cluster
        self.kubeconfig = kube.kubeconfig(cluster.tmp / "kubeconfig")
        self.bootstrap = f"127.0.0.1:{free_port()}"
        self.proc: Proc | None = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.popen is not None and self.proc.popen.poll() is None

    def start(self) -> Proc:
        os.environ["KUBECONFIG"] = str(self.kubeconfig)  # the child inherits it (restored at the end)
        self.proc = Proc(
            "operator",
            [
                "k8s",
                "operator",
                "--controller",
                self.cluster.address,
                "--token-file",
                str(self.cluster.tmp / "token"),
                "--namespace",
                "stoke",
                "--refresh",
                "1.0",
                "--bootstrap-listen",
                self.bootstrap,
                "--log-level",
                "INFO",
            ],
            self.cluster.tmp / "operator.log",
        )
        self.cluster.procs.append(self.proc)
        return self.proc.start()


@pytest.fixture(scope="module")
def operator(cluster: Cluster, kube: MockKubernetes) -> Iterator[Operator]:
    """The operator, started once for the module (a test may kill and restart it)."""
    before = os.environ.get("KUBECONFIG")
    op = Operator(cluster, kube)
    op.start()
    try:
        yield op
    finally:
        if before is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = before
