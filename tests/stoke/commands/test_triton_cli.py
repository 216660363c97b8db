"""`stoke triton render` / `sync` and input errors (no server needed)."""
from __future__ import annotations

import argparse
import json

import pytest

from controller.render import read_config
from controller.solver.problem import GpuPlan, Placement, Plan, plan_to_dict
from stoke.commands import triton as commands
from stoke.errors import StokeError


@pytest.fixture
def parser():
    p = argparse.ArgumentParser(prog="stoke")
    commands.register(p.add_subparsers(dest="command", required=True))
    return p


def run(parser, argv):
    args = parser.parse_args(argv)
    return args.run(args)


@pytest.fixture
def plan_file(tmp_path):
    plan = Plan(strategy="t", gpus=(GpuPlan("V100", 2.48, (
        Placement(name="web", model="mlp_small", slo_ms=40.0, rate_rps=300.0, share_pct=60.0, batch=8,
                  queue_delay_ms=23.333333, predicted_latency_ms=4.0, predicted_throughput_rps=900.0),)),))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_to_dict(plan)))
    return path


def test_render_writes_then_reports_nothing_to_do(parser, plan_file, demo_repo_copy, capsys):
    assert run(parser, ["triton", "render", str(plan_file), "--repo", str(demo_repo_copy)]) == 0
    out = capsys.readouterr().out
    assert "mlp_small/config.pbtxt" in out
    cfg = read_config(demo_repo_copy / "mlp_small" / "config.pbtxt")
    assert cfg.max_batch_size == 8 and cfg.dynamic_batching.max_queue_delay_microseconds == 23333
    assert list(cfg.instance_group[0].gpus) == [0]
    assert run(parser, ["triton", "render", str(plan_file), "--repo", str(demo_repo_copy), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"changed": []}


def test_bad_inputs_are_one_line_user_errors(parser, plan_file, tmp_path, demo_repo_copy):
    with pytest.raises(StokeError, match="missing.json: cannot read plan"):
        run(parser, ["triton", "render", str(tmp_path / "missing.json"), "--repo", str(demo_repo_copy)])
    bad = tmp_path / "bad.json"
    bad.write_text("{\"gpus\": [{\"gpu_type\": \"V100\", \"workloads\": [{\"name\": \"w\"}]}]}")
    with pytest.raises(StokeError, match=r"bad.json: gpus\[0\].workloads\[0\] lacks field '"):
        run(parser, ["triton", "render", str(bad), "--repo", str(demo_repo_copy)])
    bad.write_text("{not json")
    with pytest.raises(StokeError, match="not valid JSON"):
        run(parser, ["triton", "render", str(bad), "--repo", str(demo_repo_copy)])
    with pytest.raises(StokeError, match="--repo .*not found"):
        run(parser, ["triton", "render", str(plan_file), "--repo", str(tmp_path / "nope")])
    (demo_repo_copy / "mlp_small" / "config.pbtxt").write_text("max_batch_size: many")
    with pytest.raises(StokeError, match="mlp_small/config.pbtxt: not a valid Triton model config"):
        run(parser, ["triton", "render", str(plan_file), "--repo", str(demo_repo_copy)])
    with pytest.raises(StokeError, match="--rate must be a positive number of requests per second"):
        run(parser, ["load", "--url", "127.0.0.1:1", "--model", "m", "--rate", "0", "--seconds", "1"])


def test_sync_to_a_directory(parser, demo_repo_copy, tmp_path, capsys):
    assert run(parser, ["triton", "sync", str(demo_repo_copy), str(tmp_path / "mirror"), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert "tiny_echo/config.pbtxt" in first["uploaded"] and first["deleted"] == []
    assert run(parser, ["triton", "sync", str(demo_repo_copy), str(tmp_path / "mirror")]) == 0
    assert "already in sync" in capsys.readouterr().out
