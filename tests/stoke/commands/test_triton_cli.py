"""`stoke triton render` / `sync` and input errors (no server needed)."""

from __future__ import annotations

import argparse
import io
import json
import re

import pytest

from controller.render import read_config
from foundation.errors import StokeError, UserError
from planner.solver.problem import GpuPlan, Placement, Plan, plan_to_dict
from stoke.commands import triton as commands


@pytest.fixture
def parser():
    from stoke.commands import load

    p = argparse.ArgumentParser(prog="stoke")
    subparsers = p.add_subparsers(dest="command", required=True)
    commands.register(subparsers)
    load.register(subparsers)
    return p


def run(parser, argv):
    args = parser.parse_args(argv)
    return args.run(args)


@pytest.fixture
def plan_file(tmp_path):
    plan = Plan(
        strategy="t",
        gpus=(
            GpuPlan(
                "V100",
                2.48,
                (
                    Placement(
                        name="web",
                        model="mlp_small",
                        slo_ms=40.0,
                        rate_rps=300.0,
                        share_pct=60.0,
                        batch=8,
                        queue_delay_ms=23.333333,
                        predicted_latency_ms=4.0,
                        predicted_throughput_rps=900.0,
                    ),
                ),
            ),
        ),
    )
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
    bad.write_text('{"gpus": [{"gpu_type": "V100", "workloads": [{"name": "w"}]}]}')
    with pytest.raises(StokeError, match=r"bad.json: gpus\[0\].workloads\[0\] lacks field '"):
        run(parser, ["triton", "render", str(bad), "--repo", str(demo_repo_copy)])
    bad.write_text("{not json")
    with pytest.raises(StokeError, match="not valid JSON"):
        run(parser, ["triton", "render", str(bad), "--repo", str(demo_repo_copy)])
    with pytest.raises(StokeError, match="--repo .*not found"):
        run(parser, ["triton", "render", str(plan_file), "--repo", str(tmp_path / "nope")])
    for argv in (["render", str(plan_file), "--repo"], ["up", "--repo"]):  # a file where the folder goes
        with pytest.raises(
            UserError, match=rf"^--repo {re.escape(str(plan_file))}: is a file, not a directory \(a model repo"
        ):
            run(parser, ["triton", *argv, str(plan_file)])
    with pytest.raises(
        UserError, match=rf"^{re.escape(str(plan_file))}: is a file, not a directory \(a model repository is a"
    ):
        run(parser, ["triton", "sync", str(plan_file), str(tmp_path / "store")])
    with pytest.raises(UserError, match=r"^--repo '/nope\\x1b\[2J': model repository not found; give a directory"):
        run(parser, ["triton", "render", str(plan_file), "--repo", "/nope\x1b[2J"])  # shown escaped
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


def test_sync_refuses_what_would_delete_the_repository_or_miss_the_store(parser, demo_repo_copy, tmp_path):
    """A sync makes DEST hold exactly DIR's files: a model's own folder synced into its repository deleted 13 of
    its 15 files, and a destination inside DIR was filled with a copy of DIR while its own files went. A URL other
    than s3:// was taken for a folder (gs://bucket/p wrote ./gs:/bucket/p); a bad --endpoint-url was a traceback.
    Each is refused before anything is written."""
    before = sorted(p.relative_to(demo_repo_copy) for p in demo_repo_copy.rglob("*"))
    refusals = [
        ([str(demo_repo_copy / "mlp_small"), str(demo_repo_copy)], "not a model repository (it holds no <model>/"),
        ([str(demo_repo_copy), str(demo_repo_copy / "mlp_small")], "overlap (one holds the other)"),
        ([str(demo_repo_copy), str(demo_repo_copy / "mirror")], "overlap (one holds the other)"),
        ([str(demo_repo_copy), str(demo_repo_copy)], "overlap (one holds the other)"),
        ([str(demo_repo_copy), "gs://bucket/p"], "only s3:// URLs and local directories"),
        ([str(demo_repo_copy), "s3://b/p", "--endpoint-url", "notaurl"], "is not an http(s) URL"),
    ]
    for argv, message in refusals:
        with pytest.raises(StokeError, match=re.escape(message)):
            run(parser, ["triton", "sync", *argv])
    assert sorted(p.relative_to(demo_repo_copy) for p in demo_repo_copy.rglob("*")) == before
    assert not (tmp_path / "gs:").exists()
    with pytest.raises(UserError, match="only s3:// URLs and local directories"):
        run(parser, ["triton", "up", "--repo", "gs://bucket/p"])


def _plan_of(path, gpus):
    """A plan file with the given GPUs, each a list of (workload, share_pct)."""
    plan = Plan(
        strategy="t",
        gpus=tuple(
            GpuPlan(
                "CPU",
                0.1,
                tuple(
                    Placement(
                        name=name,
                        model="tiny_echo",
                        slo_ms=50.0,
                        rate_rps=10.0,
                        share_pct=share,
                        batch=1,
                        queue_delay_ms=0.0,
                        predicted_latency_ms=1.0,
                        predicted_throughput_rps=100.0,
                    )
                    for name, share in placements
                ),
            )
            for placements in gpus
        ),
    )
    path.write_text(json.dumps(plan_to_dict(plan)))
    return path


def test_up_refuses_a_plan_with_more_devices_than_the_cpu_node(parser, tmp_path, demo_repo_copy):
    import os

    cores = len(os.sched_getaffinity(0))
    whole = _plan_of(tmp_path / "two.json", [[("a", 100.0)], [("b", 100.0)]])  # two whole nodes' worth
    with pytest.raises(UserError) as err:
        run(parser, ["triton", "up", "--repo", str(demo_repo_copy), "--plan", str(whole), "--seconds", "0"])
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"--plan {whole}: does not fit this node:")
    assert f"need {2 * cores} whole cores (a#0: {cores}, b#0: {cores}) but this CPU node has {cores}" in message
    assert "plan device(s) 0, 1" in message and "--models" in message and "stoke agent" in message
    # one plan device whose shares add up to 90%, but each rounds up to a whole core: one more than the node has
    rounded = _plan_of(tmp_path / "rounded.json", [[(f"w{i}", 90.0 / (cores + 1)) for i in range(cores + 1)]])
    with pytest.raises(UserError, match=f"need {cores + 1} whole cores .* this CPU node has {cores}"):
        run(parser, ["triton", "up", "--repo", str(demo_repo_copy), "--plan", str(rounded), "--seconds", "0"])


def test_overcommit_check_accepts_what_fits():
    from agents.triton import overcommit_problems
    from controller.messages import ModelAssignment

    def a(name, share, device=0):
        return ModelAssignment(
            workload=name,
            model="m",
            device=device,
            share_pct=share,
            batch=1,
            queue_delay_ms=0.0,
            slo_ms=10.0,
            rate_rps=1.0,
        )

    assert overcommit_problems([a("x", 50), a("y", 50)], device_kind="cpu", devices=1, cores=[0, 1]) == []
    assert overcommit_problems([a("x", 50), a("y", 50, device=3)], device_kind="cpu", devices=1, cores=[0, 1]) == []
    assert overcommit_problems([a("x", 60), a("y", 40)], device_kind="gpu", devices=1, cores=[0]) == []
    gpu = overcommit_problems([a("x", 60), a("y", 50), a("z", 10, device=2)], device_kind="gpu", devices=2, cores=[0])
    assert gpu == [
        "it needs GPU(s) 2 (z#0) but this node has 2 GPU(s)",
        "GPU 0 shares add up to 110% (x#0: 60%, y#0: 50%)",
    ]


def test_render_dry_run_shows_the_diff_and_writes_nothing(parser, plan_file, demo_repo_copy, capsys, monkeypatch):
    config = demo_repo_copy / "mlp_small" / "config.pbtxt"
    before = config.read_text()
    monkeypatch.setattr("sys.stdin", io.StringIO(plan_file.read_text()))  # the plan from stdin
    assert run(parser, ["triton", "render", "-", "--repo", str(demo_repo_copy), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert config.read_text() == before  # nothing written
    assert f"--- {config} (canonical form)\n+++ {config}\n" in out
    # only settings change: the hand-written layout ("input [ {", "dims: [ 64 ]") is not in the diff
    changed = [line for line in out.splitlines() if line[:1] in "+-" and not line.startswith(("---", "+++"))]
    assert changed and not any("[" in line or line[1:].startswith(("input", "output", "backend")) for line in changed)
    assert "+max_batch_size: 8\n" in out and "max_queue_delay_microseconds: 23333" in out
    assert out.rstrip().endswith("dry run: 1 of 1 config(s) would change; nothing written")
    assert run(parser, ["triton", "render", str(plan_file), "--repo", str(demo_repo_copy)]) == 0
    capsys.readouterr()
    assert (
        run(parser, ["triton", "render", str(plan_file), "--repo", str(demo_repo_copy), "--dry-run", "-o", "json"]) == 0
    )
    assert json.loads(capsys.readouterr().out) == {"dry_run": True, "would_change": [], "diff": {}}


def test_sync_dry_run_lists_changes_and_changes_nothing(parser, demo_repo_copy, tmp_path, capsys):
    mirror = tmp_path / "mirror"
    assert run(parser, ["triton", "sync", str(demo_repo_copy), str(mirror), "--dry-run", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert "tiny_echo/config.pbtxt" in planned["uploaded"] and planned["dry_run"] is True
    assert not mirror.exists() or not any(mirror.rglob("*.pbtxt"))
    assert run(parser, ["triton", "sync", str(demo_repo_copy), str(mirror)]) == 0
    (demo_repo_copy / "tiny_echo" / "config.pbtxt").write_text("max_batch_size: 4\n")
    (mirror / "stale.txt").write_text("old")
    capsys.readouterr()
    assert run(parser, ["triton", "sync", str(demo_repo_copy), str(mirror), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert [line.split() for line in out.splitlines()[2:4]] == [
        ["upload", "tiny_echo/config.pbtxt"],
        ["delete", "stale.txt"],
    ]
    assert "1 would be uploaded, 1 would be deleted" in out and "dry run, nothing written" in out
    assert (mirror / "stale.txt").exists() and (
        mirror / "tiny_echo" / "config.pbtxt"
    ).read_text() != "max_batch_size: 4\n"


@pytest.mark.parametrize(
    "flag, value, expected",
    [
        ("--seconds", "-5", "--seconds must be a number >= 0"),
        ("--ready-timeout", "-1", "--ready-timeout must be a positive"),
    ],
)
def test_up_refuses_negative_seconds(parser, demo_repo_copy, flag, value, expected):
    with pytest.raises(UserError, match=expected):
        run(parser, ["triton", "up", "--repo", str(demo_repo_copy), flag, value])


def test_device_serve_refuses_a_negative_duration(capsys):
    from stoke.cli import main

    assert main(["device", "serve", "--port", "0", "--device", "cpu", "--duration", "-1"]) == 2
    assert "--duration must be >= 0 seconds" in capsys.readouterr().err


@pytest.mark.slow
def test_sync_to_a_missing_bucket_names_create_bucket(parser, demo_repo_copy, moto_server):
    dest = "s3://no-such-bucket/models"
    with pytest.raises(UserError, match="NoSuchBucket.*; create it with --create-bucket"):
        run(parser, ["triton", "sync", str(demo_repo_copy), dest, "--endpoint-url", moto_server])
    assert (
        run(parser, ["triton", "sync", str(demo_repo_copy), dest, "--endpoint-url", moto_server, "--create-bucket"])
        == 0
    )


def test_sync_without_aws_credentials_says_how_to_configure_them(parser, demo_repo_copy, no_aws_credentials):
    with pytest.raises(UserError, match="Unable to locate credentials.*; configure AWS credentials.*AWS_PROFILE"):
        run(parser, ["triton", "sync", str(demo_repo_copy), "s3://b/m", "--endpoint-url", "http://127.0.0.1:9"])


def test_load_checks_its_csv_path_before_the_sweep(parser, tmp_path, capsys):
    """--csv was written after the whole sweep: a path that could not be written lost every result."""
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["load", "--url", "127.0.0.1:1", "--model", "m", "--csv", str(tmp_path / "no" / "x.csv")])
    assert exit_.value.code == 2 and "does not exist; create it first" in capsys.readouterr().err


def test_up_refuses_a_model_name_it_does_not_have_beside_one_it_has(parser, demo_repo_copy):
    """`--models mlp_small,typo` served mlp_small and dropped the typo without a word."""
    with pytest.raises(UserError, match=r"--models: 'typo' not in the plan or repository; choose from .*mlp_small"):
        run(parser, ["triton", "up", "--repo", str(demo_repo_copy), "--models", "mlp_small,typo"])


def test_render_warns_when_a_cpu_plan_is_rendered_for_gpus(parser, demo_repo_copy, tmp_path, capsys):
    """A plan of examples/cpu-demo.yaml rendered without --device-kind cpu wrote KIND_GPU configs in silence."""
    cpu = Plan("t", (GpuPlan("cpu-2core", 0.1, (Placement("web", "mlp_small", 40.0, 30.0, 50.0, 2, 0.0, 1.0, 60.0),)),))
    (tmp_path / "cpu.json").write_text(json.dumps(plan_to_dict(cpu)))
    argv = ["triton", "render", str(tmp_path / "cpu.json"), "--repo", str(demo_repo_copy), "--dry-run"]
    assert run(parser, argv) == 0
    assert "cpu-2core looks like a CPU device type" in capsys.readouterr().err
    assert run(parser, [*argv, "--device-kind", "cpu"]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("localhost:99999", "port 99999 is out of range"),  # it wrapped to port 34463: another server answered
        ("host", "the port is missing"),  # gRPC went to port 443
        ("127.0.0.1:8001/path", "without a path or another scheme"),
        ("s3://x/y", "without a path or another scheme"),
    ],
)
def test_load_checks_its_url_before_connecting(parser, url, message):
    with pytest.raises(UserError, match=re.escape(message)):
        run(parser, ["load", "--url", url, "--model", "m", "--rate", "1", "--seconds", "1"])
