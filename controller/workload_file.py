"""Workload files (YAML): the workloads to serve and, optionally, the GPU inventory.

    gpu_types:                 # optional; default: the bundled V100 profile at $3.06/h
      - name: V100
        price_per_hour: 2.48
        max_count: 16          # optional count limit
        profile: v100.json     # optional fitted profile (path relative to this file)
    workloads:
      - name: web-alexnet
        model: alexnet
        slo_ms: 15
        rate_rps: 500
        gpu_type: V100         # optional preference
        arrivals: poisson      # optional: poisson (default, independent users) or constant (paced clients)

Every error names the file, the field and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from controller.solver.problem import GpuType, Problem, ProblemError, Workload
from interference.profile import DeviceProfile
from interference.profile_io import ProfileFileError, bundled_profile, load_profile
from stoke import validate as check
from stoke.errors import InputError

#: Hourly on-demand price of the bundled GPU type (AWS p3.2xlarge, one V100, us-east-1).
DEFAULT_GPU_PRICE = 3.06
EXAMPLE_WORKLOADS = "example-workloads.yaml"


class WorkloadFileError(InputError):
    """A workload file is malformed; the message names file, field and fix."""


@dataclass(frozen=True)
class WorkloadsFile:
    workloads: tuple[Workload, ...]
    gpu_types: tuple[GpuType, ...]

    def problem(self) -> Problem:
        return Problem(self.workloads, self.gpu_types)


def example_workloads_path() -> Path:
    return Path(str(resources.files("controller") / "data" / EXAMPLE_WORKLOADS))


def default_gpu_types() -> tuple[GpuType, ...]:
    return (GpuType(name="V100", price_per_hour=DEFAULT_GPU_PRICE, profile=bundled_profile()),)


def _number(item: dict[str, Any], key: str, where: str, source: str, positive: bool = True) -> float:
    value = check.require(item, key, where=f"{source}: {where}", error=WorkloadFileError)
    if positive:
        return check.positive(value, f"{where}.{key}", where=source, error=WorkloadFileError)
    return check.non_negative(value, f"{where}.{key}", where=source, error=WorkloadFileError)


def _text(item: dict[str, Any], key: str, where: str, source: str) -> str:
    return check.text(item.get(key), f"{where}.{key}", where=source, error=WorkloadFileError)


def parse_workloads(data: Any, source: str = "workloads") -> tuple[Workload, ...]:
    """Workloads from parsed YAML: a mapping with `workloads:` or a bare list."""
    items = data.get("workloads") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise WorkloadFileError(
            f"{source}: field 'workloads' must be a non-empty list of {{name, model, slo_ms, rate_rps}} entries"
        )
    workloads, seen = [], set()
    for i, item in enumerate(items):
        where = f"workloads[{i}]"
        if not isinstance(item, dict):
            raise WorkloadFileError(f"{source}: {where} must be a mapping with name, model, slo_ms, rate_rps")
        unknown = sorted(set(item) - {"name", "model", "slo_ms", "rate_rps", "gpu_type", "arrivals"})
        if unknown:
            raise WorkloadFileError(
                f"{source}: {where} has unknown field {unknown[0]!r}; "
                f"allowed: name, model, slo_ms, rate_rps, gpu_type, arrivals"
            )
        arrivals = item.get("arrivals", "poisson")
        if arrivals not in ("poisson", "constant"):
            raise WorkloadFileError(
                f"{source}: {where}.arrivals must be 'poisson' (independent users, the default) "
                f"or 'constant' (paced clients), got {arrivals!r}"
            )
        name = _text(item, "name", where, source)
        if name in seen:
            raise WorkloadFileError(f"{source}: {where}.name {name!r} is repeated; workload names must be unique")
        seen.add(name)
        gpu_type = item.get("gpu_type")
        if gpu_type is not None and (not isinstance(gpu_type, str) or not gpu_type):
            raise WorkloadFileError(f"{source}: {where}.gpu_type must be a GPU type name, got {gpu_type!r}")
        workloads.append(
            Workload(
                name=name,
                model=_text(item, "model", where, source),
                slo_ms=_number(item, "slo_ms", where, source),
                rate_rps=_number(item, "rate_rps", where, source),
                gpu_type=gpu_type,
                arrivals=arrivals,
            )
        )
    return tuple(workloads)


def parse_gpu_types(data: Any, source: str, base_dir: Path) -> tuple[GpuType, ...]:
    items = data.get("gpu_types") if isinstance(data, dict) else None
    if items is None:
        return default_gpu_types()
    if not isinstance(items, list) or not items:
        raise WorkloadFileError(
            f"{source}: field 'gpu_types' must be a non-empty list of {{name, price_per_hour, profile?, max_count?}}"
        )
    types = []
    for i, item in enumerate(items):
        where = f"gpu_types[{i}]"
        if not isinstance(item, dict):
            raise WorkloadFileError(f"{source}: {where} must be a mapping")
        name = _text(item, "name", where, source)
        price = _number(item, "price_per_hour", where, source, positive=False)
        max_count = item.get("max_count")
        if max_count is not None:
            check.whole(max_count, f"{where}.max_count", where=source, error=WorkloadFileError)
        if "profile" in item:
            path = base_dir / str(item["profile"])
            try:
                profile = load_profile(path)
            except ProfileFileError as err:
                raise WorkloadFileError(f"{source}: {where}.profile: {err}") from None
        else:
            profile = bundled_profile()
            if name != profile.gpu.name:
                # silently planning an A100 with V100 coefficients would be wrong by a wide margin
                raise WorkloadFileError(
                    f"{source}: {where} ({name!r}) has no profile; give `profile: FILE` "
                    f"(fit one with `stoke profile fit`) - only {profile.gpu.name!r} has a "
                    f"bundled profile"
                )
        types.append(GpuType(name=name, price_per_hour=price, profile=profile, max_count=max_count))
    return tuple(types)


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as err:
        raise WorkloadFileError(f"{path}: cannot read workload file ({err.strerror})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise WorkloadFileError(f"{path}: malformed YAML{at}; fix the syntax") from None


def read_workloads(path: str | Path) -> tuple[Workload, ...]:
    """Only the workloads of a file (its gpu_types are not read: a controller's nodes are the inventory)."""
    return parse_workloads(_read_yaml(Path(path)), str(path))


def load_workloads_file(path: str | Path | None = None, profile: DeviceProfile | None = None) -> WorkloadsFile:
    """Read a workload file (default: the bundled example) and check it against its inventory.

    `profile`, when given, replaces every GPU type's profile before the check (`stoke plan
    --profile`): the workloads may name models only that profile knows.
    """
    path = Path(path) if path is not None else example_workloads_path()
    source = str(path)
    data = _read_yaml(path)
    gpu_types = parse_gpu_types(data, source, path.parent)
    if profile is not None:
        gpu_types = tuple(replace(g, profile=profile) for g in gpu_types)
    result = WorkloadsFile(parse_workloads(data, source), gpu_types)
    try:
        result.problem()
    except ProblemError as err:
        raise WorkloadFileError(f"{source}: {err}") from None
    return result
