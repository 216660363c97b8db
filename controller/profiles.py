"""The profile book: the stored profiles, fitted and active, cached, and what readers need of it.

`Profiles` is what the closed loop and the reconcile loop read (`snapshot`, `fitted`, `reload`);
`ProfileBook` implements it over the store. With verification on, the active profiles carry the
points verify before serving measured (`Store.measured_points`, `ModelProfile.with_measured`). A recalibrated version
(`controller.feedback`) or a rollback makes the store's active version change; `reload` reads it and
counts a change, so the next reconcile pass re-plans.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from controller.store import Store
from foundation.names import shown
from interference.profile import PROFILE_FORMAT_VERSION, DeviceProfile
from interference.profile_io import ProfileFileError, profile_from_dict, profile_to_dict

log = logging.getLogger("stoke.controller.profiles")


class Profiles(Protocol):
    """The profiles as their readers see them: the active ones with a change count, the fitted ones."""

    def snapshot(self) -> tuple[dict[str, DeviceProfile], int]: ...
    def fitted(self) -> dict[str, DeviceProfile]: ...
    def reload(self) -> None: ...


def read_stored(gpu: dict[str, Any], models: dict[str, Any], where: str) -> DeviceProfile:
    """A profile as the store holds it (JSON: its GPU, its models), read as the profile book reads it; raises
    `ProfileFileError` naming `where` for what the book would refuse (the closed loop stores nothing such)."""
    return profile_from_dict({"format_version": PROFILE_FORMAT_VERSION, "gpu": gpu, "models": models}, where)


class ProfileBook:
    """The stored profiles, cached: the fitted ones and the active ones (a recalibrated version where
    one is active), with a version that counts every change."""

    def __init__(self, store: Store, *, measured_points: bool = False) -> None:
        """`measured_points`: join the points verify before serving measured (`verification.enabled`); with it
        off they stay stored but count nowhere, so turning verification off goes back to the plain profiles."""
        self.store = store
        self.measured_points = measured_points
        self._lock = threading.Lock()
        # reloads one at a time: two that overlap must not leave the cache with the older read of the store (the
        # cache lock alone is held only to swap, so readers never wait on the store)
        self._reload_lock = threading.Lock()
        self._version = 0
        self._refused: tuple[str, ...] = ()
        self._fitted, self._profiles, self._refused = self._load()

    def _load(self) -> tuple[dict[str, DeviceProfile], dict[str, DeviceProfile], tuple[str, ...]]:
        """(fitted, active, why stored profiles were refused, in words for `stoke status`)."""
        fitted, active = {}, {}
        refused: list[str] = []
        overrides = self.store.active_model_dicts()
        measured = self.store.measured_points() if self.measured_points else {}
        for gpu_type, data in self.store.profile_dicts().items():
            if not data["models"]:
                continue
            where = f"stored profile {shown(gpu_type)}"  # stored by a version that checked names less, maybe
            try:
                fitted[gpu_type] = read_stored(data["gpu"], data["models"], where)
            except ProfileFileError as err:
                # stored by a version that checked less: the controller starts without it rather than not at all
                refused.append(
                    f"{err}; this GPU type has no profile (its workloads wait) until one that passes is "
                    "uploaded: `stoke profiles upload FILE`"
                )
                log.error("%s", refused[-1])
                continue
            models = {m: overrides.get((gpu_type, m), value) for m, value in data["models"].items()}
            try:
                profile = read_stored(data["gpu"], models, where)
            except ProfileFileError as err:
                refused.append(
                    f"{err} (a recalibrated version); this GPU type plans with its fitted profile, which "
                    "`stoke profiles rollback MODEL --gpu-type TYPE` pins"
                )
                log.error("%s", refused[-1])
                profile = fitted[gpu_type]
            # points verify before serving measured override the fit (and a recalibrated version) there
            active[gpu_type] = DeviceProfile(
                profile.gpu,
                {
                    name: m.with_measured(measured[(gpu_type, name)]) if (gpu_type, name) in measured else m
                    for name, m in profile.models.items()
                },
            )
        return fitted, active, tuple(refused)

    def alerts(self) -> tuple[str, ...]:
        """Why stored profiles were refused at the last load (empty when none was)."""
        with self._lock:
            return self._refused

    def snapshot(self) -> tuple[dict[str, DeviceProfile], int]:
        """The active profiles per GPU type, and the version."""
        with self._lock:
            return dict(self._profiles), self._version

    def fitted(self) -> dict[str, DeviceProfile]:
        with self._lock:
            return dict(self._fitted)

    def reload(self) -> None:
        """Read the store again (a recalibrated version, a rollback) and count a change."""
        with self._reload_lock:
            loaded = self._load()
            with self._lock:
                self._fitted, self._profiles, self._refused = loaded
                self._version += 1

    def put(self, gpu_type: str, profile: DeviceProfile, now: float) -> None:
        data = profile_to_dict(profile)
        self.store.put_profile(gpu_type, data["gpu"], data["models"], now)
        self.reload()
