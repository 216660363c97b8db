"""ModelAssignment -> Triton model configuration (`config.pbtxt`); a whole plan: `controller.render_plan`.

`config.pbtxt` is Triton's `ModelConfig` protobuf
(`tritonclient.grpc.model_config_pb2`), read and written with protobuf text
format, never string templates. Rendering is a pure projection: it sets the
fields a plan decides and keeps every other field of the user's base config,
so rendering a rendered config again with the same assignment gives the same
bytes (and rendering is deterministic).

Fields a plan entry sets:

- ``max_batch_size`` = the planned batch.
- ``dynamic_batching``: ``preferred_batch_size [batch]`` (when batch > 1) and
  ``max_queue_delay_microseconds`` = the plan's ``queue_delay_ms`` x 1000. The
  solver derives it from the batch and the rate as ``1000 * (batch - 1) /
  rate_rps`` (`planner.solver.problem.batch_queue_delay_ms`): the time for a
  full batch to arrive at the planned rate. At the planned rate batches fill to
  ``batch`` and go at once (preferred size); at a lower rate a batch waits at
  most that long for stragglers, which is the wait the solver already counted
  in ``predicted_worst_ms``. Batch 1 means no wait. Other dynamic-batching
  fields of the base (priorities, ordering) are kept.
- ``instance_group``: one group, ``KIND_GPU`` with ``gpus [index]`` on a GPU
  node, ``KIND_CPU`` on a CPU node; the base group's count and other fields
  are kept.
- ``model_metrics`` (optional, `latency_histogram=True`): a per-model
  ``nv_inference_first_response_histogram_ms`` histogram whose buckets include
  the workload's SLO, so an alert can count requests slower than the SLO.
  Triton 2.51 (the server shipped with nvidia-pytriton) does not know this
  field and refuses such a config, so callers enable it only for newer servers.

Only `write_config` touches the file system (atomic, and only when the bytes
change).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc.model_config_pb2 import ModelConfig

from controller.messages import ModelAssignment
from foundation.errors import InputError
from foundation.files import atomic_write_text

CONFIG_NAME = "config.pbtxt"
HISTOGRAM_FAMILY = "nv_inference_first_response_histogram_ms"
#: Latency histogram buckets (ms); the workload's SLO is always added.
DEFAULT_BUCKETS_MS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)
DEVICE_KINDS = ("cpu", "gpu")


class RenderError(InputError):
    """A base config or an assignment cannot be rendered; the message names the file/field."""


#: Largest config.pbtxt read (bytes): a real one is a few KiB; a larger file is refused, not read whole.
MAX_CONFIG_BYTES = 1 << 20
#: Where a path parameter may point: inside the model's folder (Triton expands this variable).
MODEL_DIR_VARIABLE = "$$TRITON_MODEL_DIRECTORY"


def _path_problem(value: str, what: str, *, plain_name: bool = False) -> str:
    """Why `value` (a path from a model config) may leave its model's folder; "" when it may not."""
    if not value:
        return ""
    rest = value.removeprefix(MODEL_DIR_VARIABLE + "/") if value.startswith(MODEL_DIR_VARIABLE + "/") else value
    parts = rest.replace("\\", "/").split("/")
    if plain_name and "/" in rest.replace("\\", "/"):
        return f"{what} {value!r} must be a file name in the model's folder, not a path"
    if rest.startswith(("/", "~")) or ".." in parts or "$" in rest or any(c in rest for c in "\0\n"):
        return f"{what} {value!r} leaves the model's folder (absolute, '..', '~' or a variable)"
    return ""


def config_path_problems(config: ModelConfig) -> list[str]:
    """File paths in a model config that could leave the model's folder (Triton would load or run what they
    name): the model file names, the backend/runtime names, custom op libraries, warm-up data files and any
    parameter value that is a path."""
    problems = [
        _path_problem(config.default_model_filename, "default_model_filename", plain_name=True),
        _path_problem(config.runtime, "runtime", plain_name=True),
        _path_problem(config.backend, "backend", plain_name=True),
        _path_problem(config.platform, "platform", plain_name=True),
    ]
    problems += [
        _path_problem(v, f"cc_model_filenames[{k!r}]", plain_name=True) for k, v in config.cc_model_filenames.items()
    ]
    problems += [
        _path_problem(lib, "model_operations.op_library_filename")
        for lib in config.model_operations.op_library_filename
    ]
    for warmup in config.model_warmup:
        for name, tensor in warmup.inputs.items():
            problems.append(_path_problem(tensor.input_data_file, f"model_warmup {warmup.name!r} input {name!r}"))
    for key, parameter in config.parameters.items():
        value = parameter.string_value
        if "/" in value or "\\" in value or value.startswith(("~", "$")):
            problems.append(_path_problem(value, f"parameters[{key!r}]"))
    return [p for p in problems if p]


def parse_config(text: str, source: str = "config.pbtxt") -> ModelConfig:
    if len(text) > MAX_CONFIG_BYTES:
        raise RenderError(
            f"{source}: {len(text)} bytes, over the {MAX_CONFIG_BYTES} bytes a model config may have; it is not read"
        )
    try:
        config = text_format.Parse(text, ModelConfig())
    except text_format.ParseError as err:
        raise RenderError(f"{source}: not a valid Triton model config ({err}); fix the protobuf text format") from None
    problems = config_path_problems(config)
    if problems:
        raise RenderError(f"{source}: refused: {'; '.join(problems)}")
    return config


def read_config(path: str | os.PathLike[str]) -> ModelConfig:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)  # never the whole of a huge file
    except OSError as err:
        raise RenderError(
            f"{path}: cannot read model config ({err.strerror}); each model needs <repo>/<model>/{CONFIG_NAME}"
        ) from None
    return config_from_bytes(data, str(path))


def config_from_bytes(data: bytes, source: str) -> ModelConfig:
    """A model config from the first `MAX_CONFIG_BYTES` + 1 bytes of its file (read no more: one byte over
    says the file is too large)."""
    if len(data) > MAX_CONFIG_BYTES:
        raise RenderError(f"{source}: over the {MAX_CONFIG_BYTES} bytes a model config may have; it is not read")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RenderError(f"{source}: not UTF-8 text (offset {err.start}); save the model config as UTF-8") from None
    return parse_config(text, source)


def config_to_text(config: ModelConfig) -> str:
    return text_format.MessageToString(config)


def config_to_json(config: ModelConfig) -> str:
    """The JSON form Triton's repository API takes as a `load_model(config=...)` override."""
    return json_format.MessageToJson(config, preserving_proto_field_name=True, sort_keys=True, indent=None)


def config_from_json(data: str | Mapping[str, Any]) -> ModelConfig:
    if isinstance(data, str):
        return json_format.Parse(data, ModelConfig(), ignore_unknown_fields=True)
    return json_format.ParseDict(dict(data), ModelConfig(), ignore_unknown_fields=True)


def latency_buckets_ms(slo_ms: float) -> list[float]:
    return sorted({*DEFAULT_BUCKETS_MS, float(slo_ms)})


def queue_delay_us(assignment: ModelAssignment) -> int:
    if assignment.batch <= 1:
        return 0
    return int(round(max(0.0, assignment.queue_delay_ms) * 1000.0))


def _check(assignment: ModelAssignment, device_kind: str) -> None:
    where = f"assignment {assignment.key!r}"
    if device_kind not in DEVICE_KINDS:
        raise RenderError(f"device_kind must be one of {', '.join(DEVICE_KINDS)}, got {device_kind!r}")
    if isinstance(assignment.batch, bool) or not isinstance(assignment.batch, int) or assignment.batch < 1:
        raise RenderError(f"{where}: batch must be an integer >= 1, got {assignment.batch!r}")
    if not 0 < assignment.share_pct <= 100:
        raise RenderError(f"{where}: share_pct must be in (0, 100], got {assignment.share_pct!r}")
    if assignment.device < 0:
        raise RenderError(f"{where}: device must be >= 0, got {assignment.device!r}")


def render_config(
    base: ModelConfig,
    assignment: ModelAssignment,
    *,
    device_kind: str,
    gpu_index: int | None = None,
    latency_histogram: bool = False,
) -> ModelConfig:
    """The base config with the planned batch, batching, instance group (and histogram) set.

    `gpu_index` overrides the GPU index written on a GPU node (a Triton process
    started with ``CUDA_VISIBLE_DEVICES=<device>`` sees its GPU as 0).
    """
    _check(assignment, device_kind)
    config = ModelConfig()
    config.CopyFrom(base)
    config.name = assignment.model
    config.max_batch_size = assignment.batch

    batching = config.dynamic_batching
    del batching.preferred_batch_size[:]
    if assignment.batch > 1:
        batching.preferred_batch_size.append(assignment.batch)
    batching.max_queue_delay_microseconds = queue_delay_us(assignment)

    group = model_config_pb2.ModelInstanceGroup()
    if len(base.instance_group):
        group.CopyFrom(base.instance_group[0])
    group.count = group.count or 1
    del group.gpus[:]
    if device_kind == "gpu":
        group.kind = model_config_pb2.ModelInstanceGroup.KIND_GPU
        group.gpus.append(assignment.device if gpu_index is None else gpu_index)
    else:
        group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
    del config.instance_group[:]
    config.instance_group.append(group)

    if "model_metrics" in ModelConfig.DESCRIPTOR.fields_by_name:
        config.ClearField("model_metrics")
        if latency_histogram:
            control = config.model_metrics.metric_control.add()
            control.metric_identifier.family = HISTOGRAM_FAMILY
            control.histogram_options.buckets.extend(latency_buckets_ms(assignment.slo_ms))
    return config


def write_config(path: str | os.PathLike[str], config: ModelConfig) -> bool:
    """Write `config` as protobuf text, atomically, only when the bytes change; True if written."""
    return atomic_write_text(path, config_to_text(config))


def config_diff(path: str | os.PathLike[str], config: ModelConfig) -> str:
    """A unified diff from the file at `path` (or nothing) to `config`'s text; "" when they match.

    The current file is compared in Triton's canonical text form (as `write_config` writes it), so the
    diff shows the settings that change, not a hand-written file's layout ("dims: [ 64 ]" vs "dims: 64")."""
    new = config_to_text(config)
    try:
        old: str | None = Path(path).read_text()
    except FileNotFoundError:
        old = None
    if old == new:
        return ""
    if old is None:
        before, source = "", "/dev/null"
    else:
        try:
            before = config_to_text(parse_config(old, str(path)))
        except RenderError:
            before = old  # not a valid config: shown as it is
        if before == new:
            return (
                f"--- {path}\n+++ {path}\n(only its layout changes: the same settings, rewritten in canonical form)\n"
            )
        source = f"{path} (canonical form)" if before != old else str(path)
    diff = difflib.unified_diff(
        before.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=source, tofile=str(path)
    )
    return "".join(diff)
