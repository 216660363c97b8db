"""`stoke agent --mps` (the Kubernetes DaemonSet's agent runs its node's MPS control daemon itself)."""

from __future__ import annotations

from pathlib import Path

from stoke.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[3]


def test_mps_is_refused_on_a_node_without_gpus_before_anything_starts(capsys, tmp_path):
    argv = ["agent", "--mps", "--device", "cpu", "--repo", str(ROOT / "triton_repo"), "--node-id", "n1"]
    assert main([*argv, "--controller", "127.0.0.1:1", "--workdir", str(tmp_path / "w")]) == 2
    assert "--mps needs GPU devices" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_mps_is_off_by_default():
    assert build_parser().parse_args(["agent"]).mps is False
