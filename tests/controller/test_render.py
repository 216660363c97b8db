"""Plan -> Triton ModelConfig rendering: protobuf round trips, kept fields, atomic writes."""

from __future__ import annotations

import json
import os

import pytest
from google.protobuf import text_format
from triton_helpers import DEMO_REPO, REPO_MODELS
from tritonclient.grpc import model_config_pb2

from controller.messages import ModelAssignment
from controller.render import (
    HISTOGRAM_FAMILY,
    RenderError,
    config_from_json,
    config_to_json,
    config_to_text,
    parse_config,
    read_config,
    render_config,
    write_config,
)
from controller.render_plan import assignments_from_plan, render_plan
from planner.solver.problem import GpuPlan, Placement, Plan, plan_to_dict

A = ModelAssignment(
    workload="web",
    model="mlp_small",
    device=1,
    share_pct=40.0,
    batch=8,
    queue_delay_ms=3.5,
    slo_ms=25.0,
    rate_rps=200.0,
)

USER_BASE = """
name: "mlp_small"
backend: "python"
max_batch_size: 32
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }
parameters { key: "custom" value { string_value: "kept" } }
version_policy { latest { num_versions: 1 } }
"""


@pytest.mark.parametrize("model", REPO_MODELS)
def test_demo_configs_round_trip_through_protobuf_text(model):
    path = DEMO_REPO / model / "config.pbtxt"
    config = read_config(path)
    assert config.name == model and config.backend == "python" and config.max_batch_size == 32
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert config.input[0].dims[0] in (-1, 3, 8, 16, 64)
    again = parse_config(config_to_text(config))
    assert again == config
    assert config_from_json(config_to_json(config)) == config


def test_render_sets_planned_fields_and_keeps_the_rest():
    base = parse_config(USER_BASE)
    out = render_config(base, A, device_kind="gpu")
    assert out.max_batch_size == 8
    assert list(out.dynamic_batching.preferred_batch_size) == [8]
    assert out.dynamic_batching.max_queue_delay_microseconds == 3500
    assert out.dynamic_batching.preserve_ordering and out.dynamic_batching.priority_levels == 2
    assert len(out.instance_group) == 1
    group = out.instance_group[0]
    assert group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU and list(group.gpus) == [1]
    assert group.count == 2
    assert out.parameters["custom"].string_value == "kept"
    assert out.version_policy.latest.num_versions == 1
    assert [i.name for i in out.input] == ["INPUT0"] and out.backend == "python"
    assert base.max_batch_size == 32  # the base is not modified


def test_render_cpu_kind_and_gpu_index_override():
    base = parse_config(USER_BASE)
    cpu = render_config(base, A, device_kind="cpu")
    assert cpu.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert list(cpu.instance_group[0].gpus) == []
    gpu = render_config(base, A, device_kind="gpu", gpu_index=0)
    assert list(gpu.instance_group[0].gpus) == [0]


def test_batch_one_has_no_preferred_size_and_no_wait():
    out = render_config(
        parse_config(USER_BASE), ModelAssignment("w", "mlp_small", 0, 50.0, 1, 7.0, 10.0, 100.0), device_kind="cpu"
    )
    assert out.max_batch_size == 1
    assert list(out.dynamic_batching.preferred_batch_size) == []
    assert out.dynamic_batching.max_queue_delay_microseconds == 0


def test_render_is_deterministic_and_a_projection():
    base = parse_config(USER_BASE)
    once = render_config(base, A, device_kind="gpu")
    assert config_to_text(once) == config_to_text(render_config(base, A, device_kind="gpu"))
    # re-rendering a rendered config (the file on disk after a previous plan) gives the same bytes
    other = ModelAssignment("web", "mlp_small", 0, 20.0, 4, 1.0, 25.0, 100.0)
    assert config_to_text(
        render_config(render_config(base, other, device_kind="gpu"), A, device_kind="gpu")
    ) == config_to_text(once)


def test_latency_histogram_buckets_include_the_slo():
    out = render_config(parse_config(USER_BASE), A, device_kind="cpu", latency_histogram=True)
    control = out.model_metrics.metric_control[0]
    assert control.metric_identifier.family == HISTOGRAM_FAMILY
    buckets = list(control.histogram_options.buckets)
    assert 25.0 in buckets and buckets == sorted(buckets)
    plain = render_config(out, A, device_kind="cpu")
    assert not plain.HasField("model_metrics")


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(batch=0), "batch"),
        (dict(share_pct=0.0), "share_pct"),
        (dict(share_pct=120.0), "share_pct"),
        (dict(device=-1), "device"),
    ],
)
def test_bad_assignments_name_the_field(bad, field):
    fields = dict(
        workload="w", model="m", device=0, share_pct=50.0, batch=4, queue_delay_ms=1.0, slo_ms=10.0, rate_rps=10.0
    )
    fields.update(bad)
    with pytest.raises(RenderError, match=field):
        render_config(model_config_pb2.ModelConfig(), ModelAssignment(**fields), device_kind="cpu")
    with pytest.raises(RenderError, match="device_kind"):
        render_config(model_config_pb2.ModelConfig(), A, device_kind="tpu")


def test_parse_error_names_the_file(tmp_path):
    path = tmp_path / "config.pbtxt"
    path.write_text("max_batch_size: lots\n")
    with pytest.raises(RenderError, match=str(path)):
        read_config(path)


def test_write_config_only_when_bytes_change(tmp_path):
    path = tmp_path / "m" / "config.pbtxt"
    config = render_config(parse_config(USER_BASE), A, device_kind="cpu")
    assert write_config(path, config) is True
    mtime = path.stat().st_mtime_ns
    assert write_config(path, config) is False
    assert path.stat().st_mtime_ns == mtime
    assert text_format.Parse(path.read_text(), model_config_pb2.ModelConfig()) == config
    assert [p.name for p in path.parent.iterdir()] == ["config.pbtxt"]  # no temp file left


def _plan(*placements_per_gpu):
    gpus = []
    for placements in placements_per_gpu:
        gpus.append(
            GpuPlan(
                "V100",
                2.48,
                tuple(
                    Placement(
                        name=n,
                        model=m,
                        slo_ms=50.0,
                        rate_rps=100.0,
                        share_pct=s,
                        batch=b,
                        queue_delay_ms=(b - 1) * 10.0,
                        predicted_latency_ms=5.0,
                        predicted_throughput_rps=400.0,
                        replica=r,
                    )
                    for n, m, s, b, r in placements
                ),
            )
        )
    return Plan(strategy="test", gpus=tuple(gpus))


def test_assignments_from_plan_uses_gpu_position_as_device():
    plan = _plan([("a", "mlp_small", 50.0, 4, 0)], [("b", "conv_medium", 30.0, 2, 0), ("a", "mlp_small", 20.0, 4, 1)])
    got = assignments_from_plan(plan_to_dict(plan))
    assert [(x.key, x.device, x.share_pct, x.batch, x.queue_delay_ms) for x in got] == [
        ("a#0", 0, 50.0, 4, 30.0),
        ("b#0", 1, 30.0, 2, 10.0),
        ("a#1", 1, 20.0, 4, 30.0),
    ]


def test_render_plan_writes_changed_files_only(demo_repo_copy):
    plan = _plan([("a", "mlp_small", 50.0, 4, 0), ("b", "conv_medium", 50.0, 2, 0)])
    changed = render_plan(plan_to_dict(plan), demo_repo_copy, "gpu")
    assert sorted(changed) == sorted(str(demo_repo_copy / m / "config.pbtxt") for m in ("mlp_small", "conv_medium"))
    cfg = read_config(demo_repo_copy / "conv_medium" / "config.pbtxt")
    assert cfg.max_batch_size == 2 and cfg.dynamic_batching.max_queue_delay_microseconds == 10000
    assert cfg.input[0].dims == [3, 32, 32] and cfg.parameters["max_supported_batch"].string_value == "128"
    assert render_plan(plan, demo_repo_copy, "gpu") == []  # idempotent
    untouched = (demo_repo_copy / "tiny_echo" / "config.pbtxt").read_text()
    assert untouched == (DEMO_REPO / "tiny_echo" / "config.pbtxt").read_text()


def test_render_plan_with_diverging_replicas_writes_named_configs(demo_repo_copy):
    plan = _plan([("a", "mlp_small", 50.0, 4, 0)], [("a", "mlp_small", 50.0, 8, 1)])
    changed = render_plan(json.loads(json.dumps(plan_to_dict(plan))), demo_repo_copy, "gpu")
    named = sorted(p for p in changed if "/configs/" in p)
    assert [p.rsplit("/", 1)[1] for p in named] == ["a_0.pbtxt", "a_1.pbtxt"]
    assert read_config(named[1]).max_batch_size == 8 and list(read_config(named[1]).instance_group[0].gpus) == [1]
    assert read_config(demo_repo_copy / "mlp_small" / "config.pbtxt").max_batch_size == 4


def test_render_plan_writes_all_or_nothing(demo_repo_copy):
    # the third config's place is a directory: the two written before it get their old text back
    plan = _plan([("a", "mlp_small", 50.0, 4, 0), ("b", "conv_medium", 50.0, 2, 0)], [("a", "mlp_small", 50.0, 8, 1)])
    (demo_repo_copy / "mlp_small" / "configs" / "a_1.pbtxt").mkdir(parents=True)
    before = {m: (demo_repo_copy / m / "config.pbtxt").read_bytes() for m in ("mlp_small", "conv_medium")}
    with pytest.raises(RenderError, match=r"a_1.pbtxt: cannot write the config .*nothing was changed"):
        render_plan(plan_to_dict(plan), demo_repo_copy, "gpu")
    assert {m: (demo_repo_copy / m / "config.pbtxt").read_bytes() for m in before} == before
    assert not (demo_repo_copy / "mlp_small" / "configs" / "a_0.pbtxt").exists()


def test_a_render_that_fails_puts_a_linked_config_back_as_the_link(demo_repo_copy):
    # a repository that keeps its configs elsewhere and links them: the rollback restores the link, not a copy
    plan = _plan([("a", "mlp_small", 50.0, 4, 0)], [("a", "mlp_small", 50.0, 8, 1)])
    kept = demo_repo_copy / "kept-mlp_small.pbtxt"
    link = demo_repo_copy / "mlp_small" / "config.pbtxt"
    kept.write_bytes(link.read_bytes())
    link.unlink()
    link.symlink_to(kept)
    (demo_repo_copy / "mlp_small" / "configs" / "a_1.pbtxt").mkdir(parents=True)
    with pytest.raises(RenderError, match="nothing was changed"):
        render_plan(plan_to_dict(plan), demo_repo_copy, "gpu")
    assert link.is_symlink() and os.readlink(link) == str(kept)
    assert kept.read_bytes() == (DEMO_REPO / "mlp_small" / "config.pbtxt").read_bytes()
    assert sorted(p.name for p in (demo_repo_copy / "mlp_small").iterdir()) == sorted(
        p.name for p in (DEMO_REPO / "mlp_small").iterdir() if p.name != "__pycache__"
    ) + ["configs"]  # nothing left beside it


def test_a_render_writes_a_linked_config_as_a_file_in_the_repository_and_leaves_the_link_target(demo_repo_copy):
    # the link may point outside the repository, or at a config other models share: never written through
    plan = _plan([("a", "mlp_small", 50.0, 4, 0)])
    kept = demo_repo_copy.parent / "kept-mlp_small.pbtxt"
    link = demo_repo_copy / "mlp_small" / "config.pbtxt"
    original = link.read_bytes()
    kept.write_bytes(original)
    link.unlink()
    link.symlink_to(kept)
    assert render_plan(plan_to_dict(plan), demo_repo_copy, "gpu") == [str(link)]
    assert not link.is_symlink() and "max_batch_size: 4" in link.read_text()
    assert kept.read_bytes() == original
