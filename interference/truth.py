"""A latency truth that is not the fit: the fitted V100 profile, perturbed the way measurements differ.

Benchmarks and tests replay plans on it (`planner.simulate` with `truth_profile(...)` in place of
the fitted profile) to see what a plan does when the model is wrong. The planner never sees it: it
plans with the fitted profile, whose domain and leave-one-out error (`interference.profile.FitDomain`)
are all it knows about its own error.

The perturbation of one model's solo active time k_act(b, r), documented so a result can be judged:

1. **Measured surface.** At each measured point the truth is the measurement (the fit's residual is
   put back); between measured points the ratio measured/fitted is interpolated in (log b, log r),
   and held at the nearest edge outside them. The fit is smooth; the measurements it was fitted to
   are not.
2. **Steps between batch sizes.** Kernels run in tiles of `TILE` requests: a batch pays `STEP_WEIGHT`
   of the way from its own active time to that of the next multiple of `TILE` (batch 5 pays 10% of the
   difference to batch 8): a staircase on top of the smooth curve, up to ~5% at small batches
   (measured batch sizes keep their measurement).
3. **Bumps.** Every (batch, share step) off the measured points gets its own factor, uniform in
   +-`BUMP` (seeded per model: the same truth every run).
4. **A different curve below the measured shares.** Below the smallest measured share the active
   time grows by (smallest / share)^`BELOW_EXPONENT` on top of the fit's own extrapolation: 27% at a
   quarter of it (2.5% against 10% on a V100), the error issue 15 measured there.

`truth_profile(..., steps=False, bumps=False)` keeps 1 and 4 only: the measurements and the curve below
the measured shares, what issue 15's own replay ("replayed on measured latencies") rested on, without the
synthetic roughness of 2 and 3. Benchmarks use it to show which part of the truth costs what.

Interference (L2, power, clock) keeps the fitted model's form, fed with the perturbed active time.
Pure: numpy only.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from interference.fit import active_points
from interference.profile import DeviceProfile, ModelProfile, _interpolate

TILE = 4
STEP_WEIGHT = 0.1
BUMP = 0.05
BELOW_EXPONENT = 0.17
#: Batches the truth knows (the planners' range).
TRUTH_MAX_BATCH = 64
SEED = 15


@dataclass(frozen=True, eq=False)
class TruthModel(ModelProfile):
    """A `ModelProfile` whose active time is the perturbed truth (see the module doc)."""

    batches: tuple[float, ...] = ()  # measured batches (log-interpolation nodes)
    shares: tuple[float, ...] = ()  # measured shares
    ratio: Any = None  # measured / fitted at (batches x shares), ndarray
    bumps: Any = None  # (TRUTH_MAX_BATCH, share steps) multiplicative factors, ndarray
    share_step: float = 1.0
    step_weight: float = STEP_WEIGHT

    def smooth_ms(self, batch: float, share_pct: float) -> float:
        fitted = ModelProfile.active_time_ms(self, batch, share_pct)
        ratio = float(
            _interpolate(
                self.ratio,
                np.log(self.batches),
                np.log(self.shares),
                np.asarray(math.log(batch)),
                np.asarray(math.log(share_pct)),
            )
        )
        below = (self.shares[0] / share_pct) ** BELOW_EXPONENT if share_pct < self.shares[0] - 1e-9 else 1.0
        return fitted * ratio * below

    def active_time_ms(self, batch: float, share_pct: float) -> float:
        own = self.smooth_ms(batch, share_pct)
        tile = TILE * math.ceil(batch / TILE)
        measured = batch in self.batches  # the truth is the measurement where one was taken
        stepped = own if measured or tile == batch else own + self.step_weight * (self.smooth_ms(tile, share_pct) - own)
        b = min(int(round(batch)), TRUTH_MAX_BATCH) - 1
        s = min(max(int(round(share_pct / self.share_step)) - 1, 0), self.bumps.shape[1] - 1)
        return float(stepped * self.bumps[b, s])


def truth_profile(
    profile: DeviceProfile, raw: Mapping[str, Mapping[str, Any]], *, steps: bool = True, bumps: bool = True
) -> DeviceProfile:
    """The perturbed truth of `profile` (fitted from the raw iGniter measurements `raw`); `steps` and
    `bumps` switch parts 2 and 3 of the module doc (the measurements and the curve below the measured
    shares always stay)."""
    share_steps = int(round(100.0 / profile.gpu.share_step_pct))
    models: dict[str, ModelProfile] = {}
    for name, m in profile.models.items():
        batch, share, active = active_points(raw[name], name, profile.gpu)
        batches, shares = sorted(set(batch.tolist())), sorted(set(share.tolist()))
        ratio = np.ones((len(batches), len(shares)))
        for b, r, a in zip(batch, share, active):
            ratio[batches.index(b), shares.index(r)] = a / m.active_time_ms(b, r)
        rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
        factors = 1.0 + rng.uniform(-BUMP, BUMP, size=(TRUTH_MAX_BATCH, share_steps)) * (1.0 if bumps else 0.0)
        for b, r in zip(batch, share):  # the truth is the measurement where one was taken
            factors[int(b) - 1, int(round(r / profile.gpu.share_step_pct)) - 1] = 1.0
        fields = {f: getattr(m, f) for f in m.__dataclass_fields__}
        models[name] = TruthModel(
            **fields,
            batches=tuple(batches),
            shares=tuple(shares),
            ratio=ratio,
            bumps=factors,
            share_step=profile.gpu.share_step_pct,
            step_weight=STEP_WEIGHT if steps else 0.0,
        )
    return replace(profile, models=models)


def measure_on(truth: Mapping[str, DeviceProfile]) -> Any:
    """A simulated device for verification (`planner.solver.verify.Measure`): the truth's solo
    active time of a model at (batch, share) on a GPU type, exactly (no measurement noise)."""

    def measure(gpu_type: str, model: str, batch: int, share_pct: float) -> float:
        return float(truth[gpu_type].model(model).active_time_ms(batch, share_pct))

    return measure
