"""Reading raw measurements and reading/writing fitted profiles.

The one module of `interference` that touches files. Fitted profiles are JSON
with a ``format_version``; writes go through a temporary file and a rename so
a reader never sees half a profile.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import stat
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from interference.profile import PROFILE_FORMAT_VERSION, DeviceProfile, GpuProfile, ModelProfile

BUNDLED_RAW = "v100-raw.jsonl"
BUNDLED_PROFILE = "v100-profile.json"
#: Fitted from cpu-2core-measurements.json (`stoke profile run` on this project's 2-core CPU node);
#: `stoke up` plans with it. Both live here, not in triton_repo/, because Triton in its default
#: model-control mode treats every folder of the model repository as a model and fails on a data folder.
BUNDLED_CPU_PROFILE = "cpu-2core-profile.json"


class ProfileFileError(ValueError):
    """A profile file is missing, malformed or lacks a field."""


def read_raw(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Merge JSON lines ``{"section": {"key": value}}`` into one dict per section."""
    sections: dict[str, dict[str, Any]] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise ProfileFileError(f"{path}: cannot read raw profile ({err.strerror})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ProfileFileError(f"{path}:{number}: not valid JSON ({err.msg}); "
                                   f"each line must be {{\"section\": {{\"key\": value}}}}") from None
        if not isinstance(record, dict) or not all(isinstance(v, dict) for v in record.values()):
            raise ProfileFileError(f"{path}:{number}: each line must be {{\"section\": {{\"key\": value}}}}")
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
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [n for n in names if n not in data]
    if missing:
        raise ProfileFileError(f"{where} lacks field {missing[0]!r}; refit with `stoke profile fit`")
    values = {n: data[n] for n in names}
    for f in dataclasses.fields(cls):
        value = values[f.name]
        if f.name == "name":
            if not isinstance(value, str) or not value:
                raise ProfileFileError(f"{where} field 'name' must be a non-empty string")
        elif f.name == "k_act":
            if not (isinstance(value, list) and len(value) == 5 and all(_finite(v) for v in value)):
                raise ProfileFileError(f"{where} field 'k_act' must be a list of 5 numbers")
            values["k_act"] = tuple(float(v) for v in value)
        elif not _finite(value):
            raise ProfileFileError(f"{where} field {f.name!r} must be a number, got {value!r}")
        elif f.name in _POSITIVE and value <= 0:
            raise ProfileFileError(f"{where} field {f.name!r} must be > 0, got {value!r}; refit the profile")
    if "kernels" in values:
        values["kernels"] = int(values["kernels"])
    return cls(**values)


#: Fields that divide or scale time: zero or negative values cannot be meant.
_POSITIVE = {"max_freq_mhz", "power_cap_w", "pcie_bytes_per_ms", "share_step_pct", "kernels"}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def profile_from_dict(data: Any, source: str = "profile") -> DeviceProfile:
    if not isinstance(data, dict):
        raise ProfileFileError(f"{source}: a fitted profile must be a JSON object")
    version = data.get("format_version")
    if version != PROFILE_FORMAT_VERSION:
        raise ProfileFileError(f"{source}: format_version {version!r} is not supported (this stoke reads "
                               f"{PROFILE_FORMAT_VERSION}); refit it with `stoke profile fit RAW.jsonl -o FILE`")
    gpu = _build(GpuProfile, data.get("gpu"), f"{source}: gpu")
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise ProfileFileError(f"{source}: 'models' must be a non-empty object of fitted models")
    return DeviceProfile(gpu=gpu, models={n: _build(ModelProfile, m, f"{source}: models.{n}")
                                          for n, m in models.items()})


def load_profile(path: str | os.PathLike[str]) -> DeviceProfile:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ProfileFileError(f"{path}: cannot read profile ({err.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProfileFileError(f"{path}: not valid JSON (line {err.lineno}: {err.msg})") from None
    return profile_from_dict(data, str(path))


@contextmanager
def atomic_replace(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary handle whose bytes replace `path` only when the block ends without error.

    The data goes to a temp file beside `path`, is fsynced and renamed over
    it, so a reader never sees half a file; large files can be streamed in.
    The file gets the mode a plain ``open(path, "w")`` would give: an existing
    file keeps its mode, a new one gets 0666 less the umask (0644 usually).
    `tempfile.mkstemp` would leave it 0600, unreadable to a Triton, Prometheus
    or Grafana container running as another user.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        keep_mode: int | None = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        keep_mode = None
    fd, tmp = _create_temp_beside(target)
    try:
        with os.fdopen(fd, "wb") as handle:
            if keep_mode is not None:
                os.fchmod(handle.fileno(), keep_mode)
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` through `atomic_replace` (temp file + rename, open()'s mode)."""
    with atomic_replace(path) as handle:
        handle.write(data)


def _create_temp_beside(target: Path) -> tuple[int, Path]:
    """A new hidden file next to `target`, created with 0666 so the kernel applies the umask as open() does."""
    for _attempt in range(100):
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{target.parent}: no free temporary file name for {target.name}")


def atomic_write_text(path: str | os.PathLike[str], text: str) -> bool:
    """Write `text` to `path` through a temp file + rename (see `atomic_write_bytes`); skip if unchanged.

    Returns True when the file was written.
    """
    target = Path(path)
    try:
        if target.read_text() == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    atomic_write_bytes(target, text.encode("utf-8"))
    return True


def save_profile(profile: DeviceProfile, path: str | os.PathLike[str]) -> bool:
    return atomic_write_text(path, json.dumps(profile_to_dict(profile), indent=2, sort_keys=True) + "\n")


def bundled_profile() -> DeviceProfile:
    """The V100 profile fitted from the bundled raw measurements (iGniter's data)."""
    path = Path(str(resources.files("interference") / "data" / BUNDLED_PROFILE))
    return load_profile(path)
