"""Reading raw measurements and reading/writing fitted profiles.

The one module of `interference` that touches files. Fitted profiles are JSON
with a ``format_version``; writes go through `foundation.files.atomic_write_text`
(a temporary file and a rename) so a reader never sees half a profile.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from importlib import resources
from pathlib import Path
from typing import Any

from foundation import inputs, names
from foundation import validate as check
from foundation.errors import InputError
from foundation.files import atomic_write_text
from foundation.names import shown
from interference import raw_layout
from interference.bounds import MAX_CLIENTS, MAX_KERNELS, MAX_MEMORY_MIB
from interference.profile import (
    DOMAIN_MAX_BATCH,
    MAX_ACTIVE_MS,
    MIN_ACTIVE_MS,
    PROFILE_FORMAT_VERSION,
    SHARE_STEP_RULE,
    DeviceProfile,
    FitDomain,
    GpuProfile,
    ModelProfile,
    active_time_problems,
    on_share_step,
    share_step_count,
)

BUNDLED_RAW = "v100-raw.jsonl"
BUNDLED_PROFILE = "v100-profile.json"
#: Fitted from cpu-2core-measurements.json (`stoke profile run` on this project's 2-core CPU node);
#: `stoke up` plans with it. Both live here, not in triton_repo/, because Triton in its default
#: model-control mode treats every folder of the model repository as a model and fails on a data folder.
BUNDLED_CPU_PROFILE = "cpu-2core-profile.json"


class ProfileFileError(InputError):
    """A profile file is missing, malformed or lacks a field."""


def read_raw(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Merge JSON lines ``{"section": {"key": value}}`` into one dict per section (read bounded)."""
    text = inputs.read_text(path, "raw profile", error=ProfileFileError)
    return parse_raw(text, inputs.shown_path(path))


def parse_raw(text: str, path: str) -> dict[str, dict[str, Any]]:
    """`read_raw` of text already read (`path` names it in errors).

    Every section name, key and value is checked here, at its line (`interference.raw_layout`): an unknown key,
    a key given again on another line, or a value outside its rule is refused before anything is fitted.
    """
    layout = 'each line must be {"section": {"key": value}}'
    sections: dict[str, dict[str, Any]] = {}
    lines_of: dict[tuple[str, str], int] = {}  # (section, key) -> the line that gave it
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        record = inputs.parse_json(line, where, "raw record", error=ProfileFileError, fix=layout)
        if not isinstance(record, dict) or not all(isinstance(v, dict) for v in record.values()):
            raise ProfileFileError(f"{where}: {layout}")
        for section, values in record.items():
            if problem := raw_layout.section_problem(section):
                raise ProfileFileError(f"{where}: {problem}")
            for key, value in values.items():
                if problem := raw_layout.key_problem(section, key, value):
                    raise ProfileFileError(f"{where}: {problem}")
                first = lines_of.setdefault((section, key), number)
                if first != number and key not in raw_layout.IGNORED_KEYS:
                    raise ProfileFileError(
                        f"{where}: section {shown(section)} key {shown(key)} is given again (first on line {first}); "
                        "give each key once (the lines of a section are merged, so the last would win unseen)"
                    )
            sections.setdefault(section, {}).update(values)
    if not sections:
        raise ProfileFileError(f"{path}: raw profile is empty")
    hardware = sections.get(raw_layout.HARDWARE, {})
    memory, context = hardware.get("memory_mib", 0), hardware.get("context_mib", 0)
    if memory and context > memory:
        raise ProfileFileError(
            f"{path}:{lines_of[(raw_layout.HARDWARE, 'context_mib')]}: section 'hardware' key 'context_mib' "
            f"({context:,.10g} MiB) exceeds its 'memory_mib' ({memory:,.10g} MiB, line "
            f"{lines_of[(raw_layout.HARDWARE, 'memory_mib')]}): no replica would fit the device, so every plan "
            "would fail; correct either (context_mib: what one process takes on the device; memory_mib: its total)"
        )
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


def profile_digest(profile: DeviceProfile) -> str:
    """The SHA-256 of the profile's content (hex): a plan records the one it was made with, so that `stoke
    simulate` replays it on that profile, not on another of the same GPU type's name."""
    text = json.dumps(profile_to_dict(profile), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


#: Fields that divide or scale time: zero or negative values cannot be meant.
_POSITIVE = {"max_freq_mhz", "power_cap_w", "pcie_bytes_per_ms"}
#: Times that may be zero but not negative (ms; at most `MAX_SERVING_P99_MS`).
_NON_NEGATIVE = {"serving_p99_ms", "beyond_sli_p99_ms"}
MAX_SERVING_P99_MS = 60000.0
#: Device memory figures (MiB; 0 = not recorded): at most 1 TiB, more than any device has.
_MEMORY = {"memory_mib", "context_mib", "weights_mib", "activation_mib"}
#: `stoke profile run` output, which `stoke profile fit` turns into a profile (`interference.profiling`).
MEASUREMENTS_FORMAT = "stoke-measurements"
_FIT = "refit the profile with `stoke profile fit`"


def _build(cls: type, data: Any, where: str, step: float = 0.0) -> Any:
    """A `GpuProfile` or `ModelProfile` from its JSON object (`step`: the GPU's share step, for a model)."""
    if not isinstance(data, dict):
        raise ProfileFileError(f"{where} must be an object; {_FIT}")
    # a field with a default may be missing (profiles written before it existed load with the default)
    fields = [f for f in dataclasses.fields(cls) if f.name in data or f.default is dataclasses.MISSING]
    missing = [f.name for f in fields if f.name not in data]
    if missing:
        raise ProfileFileError(f"{where} lacks field {missing[0]!r}; {_FIT}")
    values = {f.name: _field(f.name, data[f.name], where, step) for f in fields}
    return cls(**values)


def _field(name: str, value: Any, where: str, step: float) -> Any:
    """One field's value, checked and converted (`where` names the object: "FILE: gpu", "FILE: models.ssd")."""
    field = f"{where} field {name!r}"
    if name == "name":
        return names.check_name(value, field, error=ProfileFileError)
    if name == "share_step_pct":
        check.positive(value, field, error=ProfileFileError, maximum=100, fix=_FIT)
        if share_step_count(value) is None:
            raise check.fail(field, SHARE_STEP_RULE, value, error=ProfileFileError, fix=_FIT)
        return float(value)
    if name == "domain":
        return None if value is None else _domain(value, field)
    if name == "measured":
        return _measured(value, field, step)
    if name == "k_act":
        if not (isinstance(value, list) and len(value) == 5 and all(_finite(v) for v in value)):
            raise ProfileFileError(f"{field} must be a list of 5 numbers, got {shown(value)}; {_FIT}")
        return tuple(float(v) for v in value)
    if name == "kernels":
        return check.whole(_integral(value), field, minimum=1, maximum=MAX_KERNELS, error=ProfileFileError, fix=_FIT)
    if name == "max_clients":
        return check.whole(
            _integral(value), field, maximum=MAX_CLIENTS, error=ProfileFileError, fix="write 0 when not recorded"
        )
    if name in _MEMORY:
        if not (_finite(value) and 0 <= value <= MAX_MEMORY_MIB):
            rule = f"a number of MiB from 0 (not recorded) to {MAX_MEMORY_MIB:,.0f} (1 TiB)"
            raise check.fail(field, rule, value, error=ProfileFileError, fix=_FIT)
        return float(value)
    if name in _NON_NEGATIVE:
        fix = "measure it with `stoke profile run`"
        ms = check.non_negative(value, field, error=ProfileFileError, fix=fix)
        if ms > MAX_SERVING_P99_MS:
            raise ProfileFileError(f"{field} must be at most {MAX_SERVING_P99_MS:g} ms, got {ms:g}; {fix} again")
        return ms
    if name == "idle_time_ms":  # a time like the active time: past an hour the planner's arithmetic overflows
        if not (_finite(value) and 0 <= value <= MAX_ACTIVE_MS):
            raise check.fail(
                field, f"a number of ms from 0 to {MAX_ACTIVE_MS:,.0f}", value, error=ProfileFileError, fix=_FIT
            )
        return float(value)
    if name in _POSITIVE:
        return check.positive(value, field, error=ProfileFileError, fix=_FIT)
    check.number(value, field, error=ProfileFileError, fix=_FIT)
    if abs(value) > MAX_COEFFICIENT:  # the planner multiplies these by rates: 1e308 overflowed to inf and NaN
        raise check.fail(
            field, f"a number from -{MAX_COEFFICIENT:g} to {MAX_COEFFICIENT:g}", value, error=ProfileFileError, fix=_FIT
        )
    return value  # as written (bytes_in and bytes_out stay whole)


#: Largest magnitude of any other figure of a profile (a coefficient, a power, a PCIe bandwidth of 1e7
#: bytes/ms): far above any real one, low enough that rates and batches times it stay finite.
MAX_COEFFICIENT = 1e12


def _integral(value: Any) -> Any:
    """A whole-valued float (48.0) as an int; anything else as it is (for `check.whole` to judge)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


def _domain(data: Any, where: str) -> FitDomain:
    """A `FitDomain` from its JSON object (absent in profiles saved before it existed: see `ModelProfile`)."""
    if not isinstance(data, dict) or set(data) != {"batches", "shares", "error", "floor"}:
        raise ProfileFileError(f"{where} must be an object of batches, shares, error and floor; {_FIT}")
    batches, shares, error = data["batches"], data["shares"], data["error"]
    if not (
        isinstance(batches, list)
        and 0 < len(batches) <= DOMAIN_MAX_BATCH
        and all(_whole(b) and 1 <= b <= DOMAIN_MAX_BATCH for b in batches)
        and batches == sorted(set(batches))
    ):
        raise ProfileFileError(
            f"{where}: 'batches' must be ascending whole batch sizes from 1 to {DOMAIN_MAX_BATCH} without repeats, "
            f"got {shown(batches)}; {_FIT}"
        )
    if not (
        isinstance(shares, list)
        and 0 < len(shares) <= 1024
        and all(_finite(r) and 0 < r <= 100 for r in shares)
        and shares == sorted(set(shares))
    ):
        raise ProfileFileError(
            f"{where}: 'shares' must be ascending share percentages above 0, up to 100, without repeats, "
            f"got {shown(shares)}; {_FIT}"
        )
    if not (isinstance(error, list) and all(isinstance(row, list) and all(_finite(v) for v in row) for row in error)):
        raise ProfileFileError(f"{where}: 'error' must be a grid (batches x shares) of relative errors; {_FIT}")
    if not _finite(data["floor"]):
        raise ProfileFileError(f"{where}: 'floor' must be a relative error; {_FIT}")
    try:
        return FitDomain(
            batches=tuple(int(b) for b in batches),
            shares=tuple(float(r) for r in shares),
            error=tuple(tuple(float(v) for v in row) for row in error),
            floor=float(data["floor"]),
        )
    except ValueError as err:
        raise ProfileFileError(f"{where}: {err}; {_FIT}") from None


def _measured(data: Any, where: str, step: float) -> tuple[tuple[int, float, float], ...]:
    """Verified points: a list of [batch, share %, solo active ms], each batch 1..32 at a share step of the GPU,
    from `MIN_ACTIVE_MS` to `MAX_ACTIVE_MS`."""
    rule = (
        f"[batch, share_pct, active_ms] (batch 1-{DOMAIN_MAX_BATCH}, share_pct a multiple of the {step:g}% share "
        f"step up to 100, active_ms {MIN_ACTIVE_MS:g} to {MAX_ACTIVE_MS:,.0f})"
    )
    if not isinstance(data, list) or len(data) > 100_000:
        raise ProfileFileError(f"{where} must be a list of {rule}; re-run verification")
    out = []
    for item in data:
        if not (
            isinstance(item, list)
            and len(item) == 3
            and _whole(item[0])
            and 1 <= item[0] <= DOMAIN_MAX_BATCH
            and _finite(item[1])
            and on_share_step(item[1], step)
            and _finite(item[2])
            and MIN_ACTIVE_MS <= item[2] <= MAX_ACTIVE_MS
        ):
            raise ProfileFileError(f"{where}: {shown(item)} is not {rule}; re-run verification")
        out.append((int(item[0]), float(item[1]), float(item[2])))
    return tuple(out)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def profile_from_dict(data: Any, source: str = "profile") -> DeviceProfile:
    """A `DeviceProfile` from its JSON data, every field checked (`source` names it in errors), or one line of
    `ProfileFileError`: what, where (file, model, field) and the fix."""
    if not isinstance(data, dict):
        raise ProfileFileError(f"{source}: a fitted profile must be a JSON object; fit one with `stoke profile fit`")
    if "format_version" not in data:
        raise ProfileFileError(_not_a_profile(data, source))
    version = data["format_version"]
    if version != PROFILE_FORMAT_VERSION or isinstance(version, bool):
        raise ProfileFileError(
            f"{source}: format_version {shown(version)} is not supported (this stoke reads "
            f"{PROFILE_FORMAT_VERSION}); refit it with `stoke profile fit RAW.jsonl -o FILE`"
        )
    gpu: GpuProfile = _build(GpuProfile, data.get("gpu"), f"{source}: gpu")
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise ProfileFileError(f"{source}: 'models' must be a non-empty object of fitted models; {_FIT}")
    for n in models:
        names.check_name(n, "a model name in 'models'", where=source, error=ProfileFileError)
    built: dict[str, ModelProfile] = {
        n: _build(ModelProfile, m, f"{source}: models.{n}", gpu.share_step_pct) for n, m in models.items()
    }
    for n, m in built.items():
        if m.name != n:
            raise ProfileFileError(
                f"{source}: models.{n} field 'name' must be {n!r} (its key), got {shown(m.name)}; {_FIT}"
            )
        # the planner evaluates k_act at every batch and share step: a broken range crashes it (the shape, which
        # `stoke profile fit --force` may have let through, it copes with)
        problems = active_time_problems(m.k_act, gpu.share_step_pct, shape=False)
        if problems:
            raise ProfileFileError(
                f"{source}: models.{n} field 'k_act': {problems[0]} (checked at batches 1-{DOMAIN_MAX_BATCH} x every "
                f"{gpu.share_step_pct:g}% share step); {_FIT}"
            )
    return DeviceProfile(gpu=gpu, models=built)


_NOT_FITTED = "not a fitted profile; fit it with `stoke profile fit FILE -o profile.json`"


def _not_a_profile(data: dict[str, Any], source: str) -> str:
    """Why JSON without a format_version is not a fitted profile, and what to do with it."""
    if data.get("format") == MEASUREMENTS_FORMAT:
        return f"{source}: this looks like a measurements file (`stoke profile run` output), {_NOT_FITTED}"
    if _raw_record(data):
        return f'{source}: this looks like raw measurements ({{"section": {{"key": value}}}}), {_NOT_FITTED}'
    return (
        f"{source}: has no format_version, so it is not a fitted profile (this stoke reads format_version "
        f"{PROFILE_FORMAT_VERSION}); fit one with `stoke profile fit RAW -o profile.json`"
    )


def _raw_record(data: Any) -> bool:
    """Whether `data` is a line of iGniter-style raw measurements: {"section": {"key": value}, ...}."""
    return (
        isinstance(data, dict)
        and bool(data)
        and all(isinstance(v, dict) for v in data.values())
        and ("hardware" in data or "models" not in data)
    )


def load_profile(path: str | os.PathLike[str]) -> DeviceProfile:
    """The fitted profile in the file at `path` (read bounded: `foundation.inputs`), or `ProfileFileError`."""
    text = inputs.read_text(
        path, "profile", error=ProfileFileError, fix="check the path, or fit one with `stoke profile fit`"
    )
    source = inputs.shown_path(path)
    return profile_from_dict(parse_profile_json(text, source), source)


def parse_profile_json(text: str, source: str) -> Any:
    """JSON text -> data, or `ProfileFileError` naming `source` (never a traceback, however deep the nesting or
    long the integer); raw measurements (JSON lines) are named as such."""
    try:
        return inputs.parse_json(
            text,
            source,
            "profile",
            error=ProfileFileError,
            fix="fit a profile with `stoke profile fit`",
        )
    except ProfileFileError:
        if not _raw_lines(text):
            raise
    raise ProfileFileError(
        f'{source}: this looks like raw measurements (JSON lines of {{"section": ...}}), {_NOT_FITTED}'
    )


def _raw_lines(text: str) -> bool:
    """Whether `text` opens like raw measurements: its first line one raw record."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        return _raw_record(inputs.parse_json(first, "", "line", error=ProfileFileError))
    except ProfileFileError:
        return False


def save_profile(profile: DeviceProfile, path: str | os.PathLike[str]) -> bool:
    return atomic_write_text(path, json.dumps(profile_to_dict(profile), indent=2, sort_keys=True) + "\n")


def bundled_profile() -> DeviceProfile:
    """The V100 profile fitted from the bundled raw measurements (iGniter's data)."""
    path = Path(str(resources.files("interference") / "data" / BUNDLED_PROFILE))
    return load_profile(path)


def bundled_cpu_profile() -> DeviceProfile:
    """The CPU profile `stoke up` plans with (`make cpu-profile`: this project's 2-core CPU node)."""
    return load_profile(bundled_data_dir() / BUNDLED_CPU_PROFILE)
