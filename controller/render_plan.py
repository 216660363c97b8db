"""A whole plan written into a local model repository (`stoke triton render`, `stoke triton up --plan`).

Apart from `controller.render` (one assignment -> one config), which the
agents use, because a plan is the solver's type and the agents do not import
the solver.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from controller.messages import ModelAssignment
from controller.render import (
    CONFIG_NAME,
    ModelConfig,
    RenderError,
    config_to_text,
    read_config,
    render_config,
    write_config,
)
from foundation.files import atomic_write_bytes
from planner.solver.problem import Plan, plan_from_dict


def assignments_from_plan(plan: Plan | Mapping[str, Any]) -> list[ModelAssignment]:
    """One assignment per placement; the device is the GPU's position in the plan."""
    if not isinstance(plan, Plan):
        plan = plan_from_dict(plan)
    return [ModelAssignment.of(p, index) for index, p in plan.placements()]


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in key)


def render_plan(
    plan: Plan | Mapping[str, Any],
    repo_dir: str | os.PathLike[str],
    device_kind: str,
    *,
    latency_histogram: bool = False,
) -> list[str]:
    """Write the configs of a plan into a local model repository; returns the changed paths (see `plan_configs`).

    All or nothing: when one config cannot be written (a directory where the file goes, a full disk), the
    configs already written get their old text back (or are removed) before the error goes on, so the
    repository never holds half a plan.

    A config file kept as a symlink is never written through (it may point at a config other models share):
    when its text changes, the link is replaced by a file of the rendered text.
    """
    configs = plan_configs(plan, repo_dir, device_kind, latency_histogram=latency_histogram)
    changed: list[str] = []
    before: dict[str, _Before] = {}
    try:
        for path, config in configs.items():
            before[path] = _current(path)
            if write_config(path, config):
                changed.append(path)
    except OSError as err:
        unrestored = []
        for written in changed:  # each one tried, whatever the others do
            try:
                _restore(written, before[written])
            except OSError:
                unrestored.append(written)
        outcome = (
            f"nothing was changed in {repo_dir}"
            if not unrestored
            else f"these could not be put back as they were: {', '.join(unrestored)}"
        )
        raise RenderError(f"{path}: cannot write the config ({err.strerror or err}); {outcome}") from None
    return changed


#: What a config path held before a render: nothing (None), a file's bytes, or a symlink's target (str).
_Before = bytes | str | None


def _current(path: str) -> _Before:
    if os.path.islink(path):
        return os.readlink(path)  # a repository that links its configs keeps the link, not a copy
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None


def _restore(path: str, old: _Before) -> None:
    """Put back what `_current` saw, a symlink as a symlink (made aside, then renamed over, as files are)."""
    if old is None:
        Path(path).unlink(missing_ok=True)
    elif isinstance(old, str):
        target = Path(path)
        aside = target.with_name(f".{target.name}.{secrets.token_hex(6)}.link")  # a new name: nothing it replaces
        os.symlink(old, aside)
        try:
            os.replace(aside, path)
        finally:
            aside.unlink(missing_ok=True)  # (gone once renamed)
    else:
        atomic_write_bytes(path, old)


def plan_configs(
    plan: Plan | Mapping[str, Any],
    repo_dir: str | os.PathLike[str],
    device_kind: str,
    *,
    latency_histogram: bool = False,
) -> dict[str, ModelConfig]:
    """{path: config} a plan asks of a local model repository (nothing written).

    Each model's ``config.pbtxt`` gets the first placement of that model (in
    plan order). When placements of one model differ (two workloads or
    replicas with other batches or GPUs), every placement also gets
    ``<model>/configs/<workload>_<replica>.pbtxt`` (Triton's
    ``--model-config-name``), since one directory holds one default config.
    """
    repo = Path(repo_dir)
    by_model: dict[str, list[ModelConfig]] = {}
    keyed: dict[str, list[tuple[str, ModelConfig]]] = {}
    bases: dict[str, ModelConfig] = {}
    for assignment in assignments_from_plan(plan):
        if assignment.model not in bases:
            bases[assignment.model] = read_config(repo / assignment.model / CONFIG_NAME)
        config = render_config(
            bases[assignment.model], assignment, device_kind=device_kind, latency_histogram=latency_histogram
        )
        by_model.setdefault(assignment.model, []).append(config)
        keyed.setdefault(assignment.model, []).append((f"{_safe(assignment.workload)}_{assignment.replica}", config))
    out: dict[str, ModelConfig] = {}
    for model, configs in by_model.items():
        out[str(repo / model / CONFIG_NAME)] = configs[0]
        if len({config_to_text(c) for c in configs}) > 1:
            for name, config in keyed[model]:
                out[str(repo / model / "configs" / f"{name}.pbtxt")] = config
    return out
