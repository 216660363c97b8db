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
      - name: search
        model: resnet50
        slo_ms: 40
        rate_rps: auto         # a controller plans for the observed demand (offline: min_rps, else 1 req/s)
        min_rps: 50            # optional bounds of the planned rate (auto only)
        max_rps: 800

The keys are declared once, below (`WorkloadEntry`, `GpuTypeEntry`,
`WorkloadFileSpec`, each field a `foundation.validate.setting`): the loader's
checks and wording, and the JSON Schema
`planner/data/workloads.schema.json` (``make schema`` rewrites it; a test
fails when it is stale) come from the same declarations. A file may also be
a bare list of workloads. Every error names the file, the field and the fix.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from foundation import inputs
from foundation import validate as check
from foundation.errors import InputError
from interference.profile import DeviceProfile
from interference.profile_io import ProfileFileError, bundled_profile, load_profile
from planner.bounds import MAX_GPU_COUNT, MAX_PRICE_PER_HOUR, MAX_RATE_RPS, MAX_SLO_MS
from planner.solver.problem import GpuType, Problem, ProblemError, Workload

#: Hourly on-demand price of the bundled GPU type (AWS p3.2xlarge, one V100, us-east-1).
DEFAULT_GPU_PRICE = 3.06
EXAMPLE_WORKLOADS = "example-workloads.yaml"
SCHEMA_FILE = Path(__file__).resolve().parent / "data" / "workloads.schema.json"
ARRIVALS = ("poisson", "constant")
#: Rate an auto workload without min_rps is planned for offline (a controller tracks the observed demand).
AUTO_INITIAL_RPS = 1.0


def _rate(value: Any, field: str, where: str, error: type[InputError]) -> float | str:
    if value == "auto":
        return "auto"
    return check.positive(
        value,
        field,
        where=where,
        error=error,
        maximum=MAX_RATE_RPS,
        fix="split a larger service into several workloads, or give auto",
    )


#: A rate in requests per second, or "auto" (demand tracking by the controller).
RATE = check.Rule(
    _rate, {"anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": MAX_RATE_RPS}, {"const": "auto"}]}
)


class WorkloadFileError(InputError):
    """A workload file is malformed; the message names file, field and fix."""


@dataclass(frozen=True)
class WorkloadsFile:
    workloads: tuple[Workload, ...]
    gpu_types: tuple[GpuType, ...]

    def problem(self) -> Problem:
        return Problem(self.workloads, self.gpu_types)


def example_workloads_path() -> Path:
    return Path(str(resources.files("planner") / "data" / EXAMPLE_WORKLOADS))


def default_gpu_types() -> tuple[GpuType, ...]:
    return (GpuType(name="V100", price_per_hour=DEFAULT_GPU_PRICE, profile=bundled_profile()),)


@dataclass(frozen=True)
class WorkloadEntry:
    """One service to plan and serve."""

    name: str = check.setting(rule=check.NAME, doc="unique workload name (A-Z a-z 0-9 . _ -, from a letter or digit)")
    model: str = check.setting(
        rule=check.NAME, doc="model name: in the GPU type's profile and in the Triton model repository"
    )
    slo_ms: float = check.setting(
        rule=check.positive_up_to(MAX_SLO_MS),
        doc="latency SLO of one request in ms (at most one hour); stoke plans for the p99 within it",
    )
    rate_rps: float | str = check.setting(
        rule=RATE,
        doc="request rate, requests per second (at most 1,000,000: split a larger service into several workloads); "
        "or auto: a controller plans for the observed demand",
    )
    gpu_type: str | None = check.setting(None, check.NAME, "only GPUs of this type (default: any)")
    arrivals: str = check.setting(
        "poisson", check.choice(ARRIVALS), "poisson (independent users) or constant (paced clients)"
    )
    min_rps: float | None = check.setting(
        None, check.positive_up_to(MAX_RATE_RPS), "rate_rps auto: plan for at least this rate"
    )
    max_rps: float | None = check.setting(
        None, check.positive_up_to(MAX_RATE_RPS), "rate_rps auto: plan for at most this rate"
    )

    def __post_init__(self) -> None:
        auto = self.rate_rps == "auto"
        for key in ("min_rps", "max_rps"):
            if getattr(self, key) is not None and not auto:
                raise WorkloadFileError(f"{key} applies to rate_rps: auto only; drop it or set rate_rps: auto", key)
        if self.min_rps is not None and self.max_rps is not None and self.min_rps > self.max_rps:
            raise WorkloadFileError(f"min_rps ({self.min_rps:g}) must not exceed max_rps ({self.max_rps:g})", "min_rps")


@dataclass(frozen=True)
class GpuTypeEntry:
    """A GPU type the plan may use."""

    name: str = check.setting(rule=check.NAME, doc="GPU type name, as workloads' gpu_type names it")
    price_per_hour: float = check.setting(
        rule=check.non_negative_up_to(MAX_PRICE_PER_HOUR), doc="price of one GPU of this type per hour"
    )
    max_count: int | None = check.setting(
        None, check.whole_between(0, MAX_GPU_COUNT), "at most this many GPUs of this type (default: no limit)"
    )
    profile: str | None = check.setting(
        None,
        check.PATH,
        "fitted profile JSON (`stoke profile fit`), relative to this file; "
        "only the bundled type (V100) may leave it out",
    )


@dataclass(frozen=True, kw_only=True)
class WorkloadFileSpec:
    """A stoke workload file: the workloads and, optionally, the GPU types to plan them on. (A bare list of
    workloads is accepted too.)"""

    gpu_types: tuple[GpuTypeEntry, ...] | None = check.setting(
        None, doc="GPU types to plan on (default: V100 at $3.06/h with the bundled profile)"
    )
    workloads: tuple[WorkloadEntry, ...] = check.setting(doc="the workloads (at least one; names unique)")


def workloads_schema() -> dict[str, Any]:
    schema = check.json_schema(WorkloadFileSpec, "stoke workload file")
    schema["properties"]["workloads"]["minItems"] = 1
    return schema


def schema_text() -> str:
    return json.dumps(workloads_schema(), indent=2) + "\n"


def _spec(data: Any, source: str, base_dir: Path | None) -> WorkloadFileSpec:
    if isinstance(data, list):  # a bare list of workloads
        data = {"workloads": data}
    items = data.get("workloads") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise WorkloadFileError(
            f"{source}: field 'workloads' must be a non-empty list of {{name, model, slo_ms, rate_rps}} entries"
        )
    spec = check.load(WorkloadFileSpec, data, where=source, error=WorkloadFileError, base_dir=base_dir)
    seen: set[str] = set()
    for i, w in enumerate(spec.workloads):
        if w.name in seen:
            raise WorkloadFileError(
                f"{source}: workloads[{i}].name {w.name!r} is repeated; workload names must be unique"
            )
        seen.add(w.name)
    return spec


def parse_workloads(data: Any, source: str = "workloads") -> tuple[Workload, ...]:
    """Workloads from parsed YAML: a mapping with `workloads:` or a bare list (gpu_types are not read)."""
    if isinstance(data, dict):
        data = {"workloads": data.get("workloads")}
    return tuple(map(entry_workload, _spec(data, source, None).workloads))


def entry_workload(w: WorkloadEntry) -> Workload:
    """The solver's `Workload` for a checked entry (auto: planned at min_rps, else 1 req/s, until demand is seen)."""
    auto = w.rate_rps == "auto"
    return Workload(
        name=w.name,
        model=w.model,
        slo_ms=w.slo_ms,
        rate_rps=(w.min_rps or AUTO_INITIAL_RPS) if auto else float(w.rate_rps),
        gpu_type=w.gpu_type,
        arrivals=w.arrivals,
        rate_auto=auto,
        min_rps=w.min_rps,
        max_rps=w.max_rps,
    )


def _gpu_types(spec: WorkloadFileSpec, source: str) -> tuple[GpuType, ...]:
    if spec.gpu_types is None:
        return default_gpu_types()
    types = []
    for i, item in enumerate(spec.gpu_types):
        where = f"gpu_types[{i}]"
        if item.profile is not None:
            try:
                profile = load_profile(item.profile)
            except ProfileFileError as err:
                raise WorkloadFileError(f"{source}: {where}.profile: {err}") from None
        else:
            profile = bundled_profile()
            if item.name != profile.gpu.name:
                # silently planning an A100 with V100 coefficients would be wrong by a wide margin
                raise WorkloadFileError(
                    f"{source}: {where} ({item.name!r}) has no profile; give `profile: FILE` "
                    f"(fit one with `stoke profile fit`) - only {profile.gpu.name!r} has a "
                    f"bundled profile"
                )
        types.append(
            GpuType(name=item.name, price_per_hour=item.price_per_hour, profile=profile, max_count=item.max_count)
        )
    return tuple(types)


STDIN = "-"


def _read_text(path: Path) -> str:
    if str(path) == STDIN:
        return inputs.read_stream(sys.stdin, "<stdin>", "workload file", error=WorkloadFileError)
    return inputs.read_text(path, "workload file", error=WorkloadFileError)


def _parse_yaml(text: str, source: str) -> Any:
    return inputs.parse_yaml(text, source, "workload file", error=WorkloadFileError)


def _source(path: Path) -> str:
    return "<stdin>" if str(path) == STDIN else inputs.shown_path(path)


def read_workloads(path: str | Path) -> tuple[Workload, ...]:
    """Only the workloads of a file (- = stdin); its gpu_types are not read."""
    return read_workloads_and_type_names(path)[0]


def read_workloads_and_type_names(path: str | Path) -> tuple[tuple[Workload, ...], tuple[str, ...]]:
    """(the workloads of a file, the names its gpu_types give): for a command that does not plan on the file's
    inventory (`stoke k8s render`, `stoke workload apply`), and says so when the file has one."""
    path = Path(path)
    return parse_workloads_and_type_names(_read_text(path), _source(path))


def parse_workloads_and_type_names(text: str, source: str) -> tuple[tuple[Workload, ...], tuple[str, ...]]:
    """`read_workloads_and_type_names` of a file's text."""
    data = _parse_yaml(text, source)
    types = data.get("gpu_types") if isinstance(data, dict) else None
    listed = types if isinstance(types, list) else []
    # as given (unchecked: they are only named back to the operator, escaped)
    return parse_workloads(data, source), tuple(str(t.get("name", "?")) if isinstance(t, dict) else "?" for t in listed)


def load_workloads_file(path: str | Path | None = None, profile: DeviceProfile | None = None) -> WorkloadsFile:
    """Read a workload file (default: the bundled example; - = stdin, relative paths from the current
    directory) and check it against its inventory.

    `profile`, when given, replaces every GPU type's profile before the check (`stoke plan
    --profile`): the workloads may name models only that profile knows. A file without gpu_types then plans on
    the profile's own device (its `gpu.name`) at the default price.
    """
    path = Path(path) if path is not None else example_workloads_path()
    source = _source(path)
    data = _parse_yaml(_read_text(path), source)
    base_dir = Path.cwd() if str(path) == STDIN else path.parent
    spec = _spec(data, source, base_dir)
    gpu_types = _gpu_types(spec, source)
    pinned = {w.gpu_type for w in spec.workloads if w.gpu_type}
    if profile is not None and spec.gpu_types is None and pinned <= {profile.gpu.name}:
        # the one default type is the profile's device: an A100 profile planned as "V100" labels (and prices) an
        # A100 plan as a V100 one; the default price stays (give gpu_types for the device's own). A file whose
        # workloads pin the default type by name keeps it (the CLI warns that the names differ)
        gpu_types = (GpuType(name=profile.gpu.name, price_per_hour=DEFAULT_GPU_PRICE, profile=profile),)
    elif profile is not None:
        gpu_types = tuple(replace(g, profile=profile) for g in gpu_types)
    result = WorkloadsFile(tuple(map(entry_workload, spec.workloads)), gpu_types)
    try:
        result.problem()
    except ProblemError as err:
        raise WorkloadFileError(f"{source}: {err}") from None
    return result


if __name__ == "__main__":  # `make schema`: rewrite the committed JSON Schema
    from foundation.files import atomic_write_text

    print(
        f"{SCHEMA_FILE}: {'written' if atomic_write_text(SCHEMA_FILE, schema_text()) else 'unchanged'}", file=sys.stderr
    )
