"""The one module of `training` that reads files.

Bundled data (`training/data/`): the offline instance catalog,
the ResNet-110 fixture spec (the default SPEC.yaml), an example CURVE.csv
and gradient profiles (ResNet-50-like, VGG-19-like). Errors are
`TrainingError` naming the file, the field and the fix.
"""

from __future__ import annotations

import csv
import os
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from foundation import inputs
from training.models import Array, TrainingError
from training.spec import Catalog, InstanceType

CATALOG_FORMAT_VERSION = 1
BUNDLED_SPEC = "resnet110.yaml"
BUNDLED_CURVE = "curve-example.csv"
BUNDLED_PROFILES = ("resnet50.yaml", "vgg19.yaml")
INSTANCE_FIELDS = ("gpus", "vcpus", "gpu_memory_gb", "network_mb_s", "on_demand_per_hour", "spot_per_hour")


def data_path(name: str) -> Path:
    return Path(str(resources.files("training") / "data" / name))


def _read_text(path: str | os.PathLike[str], what: str) -> str:
    return inputs.read_text(path, what, error=TrainingError)


def read_yaml(path: str | os.PathLike[str], what: str = "YAML file") -> Any:
    return inputs.parse_yaml(_read_text(path, what), inputs.shown_path(path), what, error=TrainingError)


def read_json(path: str | os.PathLike[str], what: str = "JSON file") -> Any:
    return inputs.parse_json(_read_text(path, what), inputs.shown_path(path), what, error=TrainingError)


def catalog_from_dict(data: Any, source: str, *, live: bool = False) -> Catalog:
    if not isinstance(data, dict) or data.get("format_version") != CATALOG_FORMAT_VERSION:
        raise TrainingError(f"{source}: format_version must be {CATALOG_FORMAT_VERSION}")
    types = data.get("types")
    if not isinstance(types, dict) or not types:
        raise TrainingError(f"{source}: 'types' must map instance type -> its figures")
    out = {}
    for name, t in types.items():
        missing = [f for f in INSTANCE_FIELDS if not isinstance(t, dict) or f not in t]
        if missing:
            raise TrainingError(f"{source}: types.{name} lacks field {missing[0]!r}")
        out[name] = InstanceType(
            name=name,
            gpus=int(t["gpus"]),
            vcpus=int(t["vcpus"]),
            gpu_memory_gb=float(t["gpu_memory_gb"]),
            network_mb_s=float(t["network_mb_s"]),
            on_demand_per_hour=float(t["on_demand_per_hour"]),
            spot_per_hour=float(t["spot_per_hour"]),
        )
    return Catalog(
        types=out,
        source="live" if live else "offline",
        prices_as_of=str(data.get("prices_as_of", "")),
        region=str(data.get("region", "us-east-1")),
    )


def catalog_to_dict(catalog: Catalog) -> dict[str, Any]:
    return {
        "format_version": CATALOG_FORMAT_VERSION,
        "region": catalog.region,
        "prices_as_of": catalog.prices_as_of,
        "source": catalog.source,
        "types": {n: {f: getattr(t, f) for f in INSTANCE_FIELDS} for n, t in sorted(catalog.types.items())},
    }


def offline_catalog() -> Catalog:
    path = data_path("catalog.json")
    return catalog_from_dict(read_json(path, "instance catalog"), str(path))


def read_spec(path: str | os.PathLike[str] | None) -> tuple[Any, str]:
    """Parsed SPEC.yaml (the bundled ResNet-110 fixture when `path` is None) and its name."""
    target = data_path(BUNDLED_SPEC) if path is None else Path(path)
    data = read_yaml(target, "training spec")
    return data, str(target) if path is not None else f"bundled {BUNDLED_SPEC}"


def read_curve_csv(path: str | os.PathLike[str] | None, batch: int | None = None) -> dict[str, Array]:
    """Columns of a loss-curve CSV (header row required; lines starting with # are comments).

    Accepted layouts: ``samples,loss``; ``iteration,loss`` with a ``batch``
    column or the `batch` argument (samples = iteration * batch); or the
    heterogeneous layout ``b_w,R,n,j,loss``.
    """
    target = data_path(BUNDLED_CURVE) if path is None else Path(path)
    lines = [ln for ln in _read_text(target, "loss curve").splitlines() if not ln.lstrip().startswith("#")]
    rows = list(csv.reader(lines))
    if len(rows) < 2:
        raise TrainingError(f"{target}: needs a header row and data rows (e.g. 'samples,loss')")
    header = [h.strip() for h in rows[0]]
    columns: dict[str, list[float]] = {h: [] for h in header}
    for number, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise TrainingError(f"{target}:{number}: expected {len(header)} values ({', '.join(header)})")
        for h, cell in zip(header, row):
            try:
                columns[h].append(float(cell))
            except ValueError:
                raise TrainingError(f"{target}:{number}: column {h!r} must be a number, got {cell!r}") from None
    out = {h: np.asarray(v) for h, v in columns.items()}
    if "loss" not in out:
        raise TrainingError(f"{target}: no 'loss' column; the header must name 'loss'")
    if {"b_w", "R", "n", "j"} <= set(out):
        return out
    if "samples" not in out:
        if "iteration" not in out:
            raise TrainingError(f"{target}: needs a 'samples' or 'iteration' column besides 'loss'")
        if "batch" in out:
            out["samples"] = out["iteration"] * out["batch"]
        elif batch:
            out["samples"] = out["iteration"] * batch
        else:
            raise TrainingError(f"{target}: 'iteration' needs the global batch: add a 'batch' column or pass --batch")
    return out


def read_gradient_profile(path: str | os.PathLike[str] | None, name: str | None = None) -> tuple[Any, str]:
    """Parsed PROFILE.yaml (a bundled one when `path` is None: `name` or the first)."""
    if path is None:
        chosen = name or BUNDLED_PROFILES[0]
        if not chosen.endswith(".yaml"):
            chosen += ".yaml"
        if chosen not in BUNDLED_PROFILES:
            raise TrainingError(
                f"no bundled gradient profile {name!r}; choose one of {', '.join(p[:-5] for p in BUNDLED_PROFILES)}"
            )
        return read_yaml(data_path(chosen), "gradient profile"), f"bundled {chosen}"
    return read_yaml(path, "gradient profile"), str(path)
