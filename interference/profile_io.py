"""Reading raw measurements and reading/writing fitted profiles.

The one module of `interference` that touches files. Fitted profiles are JSON
with a ``format_version``; writes go through `foundation.files.atomic_write_text`
(a temporary file and a rename) so a reader never sees half a profile.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from importlib import resources
from pathlib import Path
from typing import Any

from foundation import names
from foundation import validate as check
from foundation.errors import InputError
from foundation.files import atomic_write_text
from foundation.names import shown
from interference.profile import PROFILE_FORMAT_VERSION, DeviceProfile, FitDomain, GpuProfile, ModelProfile

BUNDLED_RAW = "v100-raw.jsonl"
BUNDLED_PROFILE = "v100-profile.json"
#: Fitted from cpu-2core-measurements.json (`stoke profile run` on this project's 2-core CPU node);
#: `stoke up` plans with it. Both live here, not in triton_repo/, because Triton in its default
#: model-control mode treats every folder of the model repository as a model and fails on a data folder.
BUNDLED_CPU_PROFILE = "cpu-2core-profile.json"


class ProfileFileError(InputError):
    """A profile file is missing, malformed or lacks a field."""


def read_raw(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Merge JSON lines ``{"section": {"key": value}}`` into one dict per section."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ProfileFileError(f"{path}: cannot read raw profile ({err.strerror})") from None
    return parse_raw(text, str(path))


def parse_raw(text: str, path: str) -> dict[str, dict[str, Any]]:
    """`read_raw` of text already read (`path` names it in errors)."""
    sections: dict[str, dict[str, Any]] = {}
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ProfileFileError(
                f'{path}:{number}: not valid JSON ({err.msg}); each line must be {{"section": {{"key": value}}}}'
            ) from None
        if not isinstance(record, dict) or not all(isinstance(v, dict) for v in record.values()):
            raise ProfileFileError(f'{path}:{number}: each line must be {{"section": {{"key": value}}}}')
        for section, values in record.items():
            sections.setdefault(section, {}).update(values)
    if not sections:
        raise ProfileFileError(f"{path}: raw profile is empty")
    return sections


def bundled_data_dir() -> Path:
    """The package's data folder (bundled raw measurements and fitted profiles)."""
    return Path(str(resources.files("interference") / "data"))


def bundled_raw_path() -> Path:
    return Path(str(resources.files("interference") / "data" / BUNDLED_RAW))


def profile_to_dict(profile: DeviceProfile) -> dict[str, Any]:
    return {
        "format_version": PROFILE_FORMAT_VERSION,
        "gpu": dataclasses.asdict(profile.gpu),
        "models": {name: dataclasses.asdict(m) for name, m in sorted(profile.models.items())},
    }


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ProfileFileError(f"{where} must be an object")
    # a field with a default may be missing (profiles written before it existed load with the default)
    fields = [f for f in dataclasses.fields(cls) if f.name in data or f.default is dataclasses.MISSING]
    missing = [f.name for f in fields if f.name not in data]
    if missing:
        raise ProfileFileError(f"{where} lacks field {missing[0]!r}; refit with `stoke profile fit`")
    values = {f.name: data[f.name] for f in fields}
    for f in fields:
        value = values[f.name]
        if f.name == "domain":
            values["domain"] = None if value is None else _domain(value, f"{where} field 'domain'")
        elif f.name == "measured":
            values["measured"] = _measured(value, f"{where} field 'measured'")
        elif f.name == "name":
            if not isinstance(value, str) or not value:
                raise ProfileFileError(f"{where} field 'name' must be a non-empty string")
        elif f.name == "k_act":
            if not (isinstance(value, list) and len(value) == 5 and all(_finite(v) for v in value)):
                raise ProfileFileError(f"{where} field 'k_act' must be a list of 5 numbers")
            values["k_act"] = tuple(float(v) for v in value)
        elif f.name in _NON_NEGATIVE:
            values[f.name] = check.non_negative(
                value, f"{where} field {f.name!r}", error=ProfileFileError, fix="measure it with `stoke profile run`"
            )
            if values[f.name] > MAX_SERVING_P99_MS:
                raise ProfileFileError(
                    f"{where} field {f.name!r} must be at most {MAX_SERVING_P99_MS:g} ms, got {values[f.name]:g}; "
                    "measure it again with `stoke profile run`"
                )
        elif f.name in _POSITIVE:
            check.positive(value, f"{where} field {f.name!r}", error=ProfileFileError, fix="refit the profile")
        else:
            check.number(value, f"{where} field {f.name!r}", error=ProfileFileError)
    for whole in ("kernels", "max_clients"):
        if whole in values:
            values[whole] = int(values[whole])
    for name in ("memory_mib", "context_mib", "weights_mib", "activation_mib", "max_clients"):
        if name in values and values[name] < 0:
            raise ProfileFileError(f"{where} field {name!r} must be >= 0 (0: not recorded); fix the profile")
    return cls(**values)


def _domain(data: Any, where: str) -> FitDomain:
    """A `FitDomain` from its JSON object (absent in profiles saved before it existed: see `ModelProfile`)."""
    fix = "refit the profile with `stoke profile fit`"
    if not isinstance(data, dict) or set(data) != {"batches", "shares", "error", "floor"}:
        raise ProfileFileError(f"{where} must be an object of batches, shares, error and floor; {fix}")
    batches, shares, error = data["batches"], data["shares"], data["error"]
    if not (isinstance(batches, list) and 0 < len(batches) <= 1024 and all(isinstance(b, int) for b in batches)):
        raise ProfileFileError(f"{where}: 'batches' must be a list of whole batch sizes; {fix}")
    if not (isinstance(shares, list) and 0 < len(shares) <= 1024 and all(_finite(r) for r in shares)):
        raise ProfileFileError(f"{where}: 'shares' must be a list of share percentages; {fix}")
    if not (isinstance(error, list) and all(isinstance(row, list) and all(_finite(v) for v in row) for row in error)):
        raise ProfileFileError(f"{where}: 'error' must be a grid (batches x shares) of relative errors; {fix}")
    if not _finite(data["floor"]):
        raise ProfileFileError(f"{where}: 'floor' must be a relative error; {fix}")
    try:
        return FitDomain(
            batches=tuple(int(b) for b in batches),
            shares=tuple(float(r) for r in shares),
            error=tuple(tuple(float(v) for v in row) for row in error),
            floor=float(data["floor"]),
        )
    except ValueError as err:
        raise ProfileFileError(f"{where}: {err}; {fix}") from None


def _measured(data: Any, where: str) -> tuple[tuple[int, float, float], ...]:
    """Verified points: a list of [batch, share %, solo active ms]."""
    if not isinstance(data, list) or len(data) > 100_000:
        raise ProfileFileError(f"{where} must be a list of [batch, share_pct, active_ms]; re-run verification")
    out = []
    for item in data:
        if not (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], int)
            and item[0] >= 1
            and all(_finite(v) and v > 0 for v in item)
            and item[1] <= 100
        ):
            raise ProfileFileError(f"{where}: {shown(item)} is not [batch, share_pct, active_ms]; re-run verification")
        out.append((int(item[0]), float(item[1]), float(item[2])))
    return tuple(out)


#: Fields that divide or scale time: zero or negative values cannot be meant.
_POSITIVE = {"max_freq_mhz", "power_cap_w", "pcie_bytes_per_ms", "share_step_pct", "kernels"}
#: Times that may be zero but not negative (ms; at most `MAX_SERVING_P99_MS`).
_NON_NEGATIVE = {"serving_p99_ms", "beyond_sli_p99_ms"}
MAX_SERVING_P99_MS = 60000.0


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def profile_from_dict(data: Any, source: str = "profile") -> DeviceProfile:
    if not isinstance(data, dict):
        raise ProfileFileError(f"{source}: a fitted profile must be a JSON object")
    version = data.get("format_version")
    if version != PROFILE_FORMAT_VERSION:
        raise ProfileFileError(
            f"{source}: format_version {version!r} is not supported (this stoke reads "
            f"{PROFILE_FORMAT_VERSION}); refit it with `stoke profile fit RAW.jsonl -o FILE`"
        )
    gpu = _build(GpuProfile, data.get("gpu"), f"{source}: gpu")
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise ProfileFileError(f"{source}: 'models' must be a non-empty object of fitted models")
    for n in models:
        names.check_name(n, "a model name in 'models'", where=source, error=ProfileFileError)
    built = {n: _build(ModelProfile, m, f"{source}: models.{n}") for n, m in models.items()}
    for n, m in built.items():
        if m.name != n:
            raise ProfileFileError(
                f"{source}: models.{n} field 'name' must be {n!r} (its key), got {shown(m.name)}; refit the profile"
            )
    return DeviceProfile(gpu=gpu, models=built)


def load_profile(path: str | os.PathLike[str]) -> DeviceProfile:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ProfileFileError(
            f"{path}: cannot read profile ({err.strerror}); check the path, or fit one with `stoke profile fit`"
        ) from None
    except UnicodeDecodeError as err:
        raise ProfileFileError(f"{path}: not UTF-8 text (byte {err.start}); a fitted profile is JSON") from None
    return profile_from_dict(parse_profile_json(text, str(path)), str(path))


def parse_profile_json(text: str, source: str) -> Any:
    """JSON text -> data, or `ProfileFileError` naming `source` (never a traceback, however deep the nesting)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ProfileFileError(
            f"{source}: not valid JSON (line {err.lineno}: {err.msg}); send a fitted profile"
        ) from None
    except RecursionError:
        raise ProfileFileError(
            f"{source}: JSON nested too deeply to be a fitted profile; send a fitted profile"
        ) from None


def save_profile(profile: DeviceProfile, path: str | os.PathLike[str]) -> bool:
    return atomic_write_text(path, json.dumps(profile_to_dict(profile), indent=2, sort_keys=True) + "\n")


def bundled_profile() -> DeviceProfile:
    """The V100 profile fitted from the bundled raw measurements (iGniter's data)."""
    path = Path(str(resources.files("interference") / "data" / BUNDLED_PROFILE))
    return load_profile(path)
