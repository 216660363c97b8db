"""Online recalibration: correct a fitted profile from what the serving path observes. Pure.

The input is calibration points. Each point is one batch size in one observation window of one
replica: the model, the batch size b, the share r it ran at, the neighbours on its device
((model, batch, share) each), the observed mean duration of one execution (ms; Triton's compute
input + infer + output, what the model calls t_inf), how many executions, and when.

The correction is per (model, GPU type): this module sees one profile (one GPU type) and one
model at a time. With every other term of the profile held at its fitted value, the predicted
duration of one execution is

    t(b, r | neighbours; c_v, c_c) = A + B * (c_v * V(b, r) + c_c * k5)

where
- V = (k1 b^2 + k2 b + k3) / (r + k4) is the share-dependent part of the fitted active time
  k_act, and k5 its constant part;
- B = (1 + alpha * sum c_other) * F/f holds the L2 interference and the clock;
- A holds the rest: input and output transfer, scheduling delay.

(c_v, c_c) = (1, 1) is the fitted profile. A corrected profile multiplies k1..k3 by c_v and k5
by c_c (`Correction.apply`), so it stays a profile of the same form that the solver reads as
any other.

The estimator (`estimate`) is deterministic, closed form and bounded:

- Forgetting. A point weighs its executions times 0.5 ** (age / half_life). Points older than
  `max_age_half_lives` half-lives are dropped.
- Regime changes. The same estimate is also made from the newest `recent_windows` windows
  alone. When it differs from the long one by more than `regime_change`, the recent evidence
  wins: a model that became 2x slower is corrected to 2x as soon as those windows show it,
  rather than creeping there through every value in between. Counting windows rather than
  seconds keeps the recent estimate's evidence whatever the gaps (a node busy moving a
  replica). Noise that oscillates around the truth averages out over those windows as well,
  so it does not pass for a change.
- Evidence. No correction unless the forgotten count of windows reaches `min_windows` and the
  forgotten executions reach `min_executions`.
- Outliers. Each point's own ratio (y - A) / (B (V + k5)) is compared with the weighted median;
  a point more than `outlier_factor` times away is dropped (a broken scrape, a stalled window).
- Scale. One factor c = c_v = c_c minimises the weighted squared relative error:
  c = sum w x (y - A) / y^2 / sum w x^2 / y^2, with x = B (V + k5).
- Refit, with the same weights, once enough distinct (batch, share, neighbours) points exist
  (`refit_min_points`, each with `refit_min_windows` of evidence) and their share-dependent
  fractions V / (V + k5) spread by at least `refit_min_spread`: (c_v, c_c) by weighted least
  squares on the same relative residuals (2x2 normal equations). The refit is kept only when
  both factors lie in bounds; otherwise the scale stands.
- Interference and clock depend on each workload's processing ability, so on the correction
  for neighbours of the same model. A and B are evaluated at the current estimate, a fixed
  `iterations` times.
- Bounds. Factors must lie in [`MIN_FACTOR`, `MAX_FACTOR`]. An estimate outside them is refused
  with the reason: a factor of 40 is more likely a broken measurement than a slow model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from interference.latency import clock_mhz, solo_point
from interference.profile import DeviceProfile, ModelProfile

#: Smallest and largest correction factor accepted.
MIN_FACTOR = 0.1
MAX_FACTOR = 10.0
#: Most points one estimate reads (the newest; bounds the work of one estimate).
MAX_POINTS = 20000

Neighbour = tuple[str, int, float]  # (model, batch, share_pct)


@dataclass(frozen=True)
class CalibrationPoint:
    """One batch size in one observation window of one replica."""

    model: str
    batch: int
    share_pct: float
    neighbours: tuple[Neighbour, ...]  # what ran beside it on the device
    observed_ms: float  # mean duration of one execution of `batch`
    executions: int
    at: float  # when (seconds; the same clock as `now`)
    window: int = 0  # the observation window it belongs to (evidence counts windows)

    @property
    def key(self) -> tuple[int, float, tuple[Neighbour, ...]]:
        return (self.batch, self.share_pct, self.neighbours)


@dataclass(frozen=True)
class RecalibrationOptions:
    """Hyper-parameters of the estimator (see the module docstring)."""

    half_life_s: float = 300.0
    min_windows: float = 5.0
    min_executions: float = 100.0
    refit_min_points: int = 4
    refit_min_windows: float = 2.0
    refit_min_spread: float = 0.2
    outlier_factor: float = 3.0
    iterations: int = 3
    max_age_half_lives: float = 10.0
    recent_windows: int = 10
    regime_change: float = 0.1  # 0: never prefer the recent windows

    def __post_init__(self) -> None:
        if not (self.half_life_s > 0 and self.min_windows >= 0 and self.min_executions >= 0):
            raise ValueError("half_life_s must be > 0, min_windows and min_executions >= 0")
        if not (self.outlier_factor > 1 and self.iterations >= 1 and self.max_age_half_lives > 0):
            raise ValueError("outlier_factor must be > 1, iterations >= 1, max_age_half_lives > 0")
        if not (self.refit_min_points >= 2 and 0 < self.refit_min_spread < 1):
            raise ValueError("refit_min_points must be >= 2 and refit_min_spread in (0, 1)")
        if not (self.recent_windows >= 1 and self.regime_change >= 0):
            raise ValueError("recent_windows must be >= 1 and regime_change >= 0")


@dataclass(frozen=True)
class Correction:
    """Factors on a model's active-time coefficients: k1..k3 by `factor`, k5 by `factor_constant`."""

    model: str
    mode: str  # "scale" (one factor) | "refit" (two)
    factor: float
    factor_constant: float
    windows: float  # forgotten count of windows behind it
    executions: float  # forgotten executions behind it
    points: int  # points used (after outliers)
    distinct: int  # distinct (batch, share, neighbours) among them
    residual: float  # weighted RMS relative error of the fit
    recent: bool = False  # made from the newest windows alone (a regime change)

    def apply(self, model: ModelProfile) -> ModelProfile:
        k1, k2, k3, k4, k5 = model.k_act
        c, cc = self.factor, self.factor_constant
        return replace(model, k_act=(k1 * c, k2 * c, k3 * c, k4, k5 * cc))

    @property
    def summary(self) -> str:
        recent = " (recent evidence: a change)" if self.recent else ""
        if self.mode == "refit":
            return f"refit x{self.factor:.3f} (k1..k3), x{self.factor_constant:.3f} (k5){recent}"
        return f"x{self.factor:.3f}{recent}"


@dataclass(frozen=True)
class Estimate:
    """The correction, or None with the reason (too little evidence, out of bounds)."""

    correction: Correction | None
    reason: str


@dataclass(frozen=True)
class _Row:
    """One distinct key's terms: y ~ A + B (c_v V + c_c K)."""

    a: float
    b: float
    v: float
    k: float


def apply_corrections(profile: DeviceProfile, corrections: Mapping[str, Correction]) -> DeviceProfile:
    """`profile` with each corrected model's active-time coefficients replaced."""
    models = {name: corrections[name].apply(m) if name in corrections else m for name, m in profile.models.items()}
    return DeviceProfile(gpu=profile.gpu, models=models)


def _terms(profile: DeviceProfile, model: str, key: tuple[int, float, tuple[Neighbour, ...]]) -> _Row:
    """A, B and the fitted V, K of one point, with `profile`'s abilities (for interference and clock)."""
    batch, share, neighbours = key
    gpu = profile.gpu
    points = [solo_point(profile, model, batch, share)] + [solo_point(profile, m, b, r) for m, b, r in neighbours]
    own = points[0]
    total_l2 = sum(p.l2_pct for p in points)
    total_power = gpu.idle_power_w + sum(p.power_w for p in points)
    slow = gpu.max_freq_mhz / clock_mhz(gpu, total_power)
    delay = gpu.scheduling_delay_ms(len(points))
    k1, k2, k3, k4, k5 = profile.model(model).k_act
    return _Row(
        a=own.load_ms + own.feedback_ms + slow * (own.idle_ms + own.kernels * delay),
        b=slow * (1.0 + own.cache_sensitivity * (total_l2 - own.l2_pct)),
        v=(k1 * batch * batch + k2 * batch + k3) / (share + k4),
        k=k5,
    )


def _weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    order = sorted(range(len(values)), key=lambda i: values[i])
    half = 0.5 * sum(weights)
    seen = 0.0
    for i in order:
        seen += weights[i]
        if seen >= half:
            return values[i]
    return values[order[-1]]


def _usable(
    points: Iterable[CalibrationPoint], model: str, now: float, options: RecalibrationOptions
) -> list[tuple[CalibrationPoint, float]]:
    """(point, forgetting factor) of `model`'s valid points within the horizon, newest first, bounded."""
    horizon = options.max_age_half_lives * options.half_life_s
    out = []
    for p in points:
        age = max(0.0, now - p.at)
        if (
            p.model == model
            and p.batch >= 1
            and 0 < p.share_pct <= 100
            and p.executions >= 1
            and math.isfinite(p.observed_ms)
            and p.observed_ms > 0
            and age <= horizon
        ):
            out.append((p, 0.5 ** (age / options.half_life_s)))
    out.sort(key=lambda pair: (-pair[0].at, pair[0].window, pair[0].batch))
    return out[:MAX_POINTS]


def estimate(
    points: Iterable[CalibrationPoint],
    profile: DeviceProfile,
    model: str,
    now: float,
    options: RecalibrationOptions | None = None,
) -> Estimate:
    """The correction of `model`'s active time on `profile` (the fitted one) from `points`; see the module."""
    options = options or RecalibrationOptions()
    profile.model(model)  # an unknown model: the profile's descriptive error
    points = list(points)
    long = _estimate(points, profile, model, now, options)
    if long.correction is None or options.regime_change <= 0:
        return long
    newest = sorted({(p.at, p.window) for p in points if p.model == model and p.at <= now}, reverse=True)
    keep = set(newest[: options.recent_windows])
    recent = [p for p in points if (p.at, p.window) in keep]
    short = _estimate(recent, profile, model, now, replace(options, regime_change=0.0))
    if short.correction is None:
        return long
    change = abs(math.log(short.correction.factor / long.correction.factor))
    if change <= math.log1p(options.regime_change):
        return long
    chosen = replace(short.correction, recent=True)
    return Estimate(
        chosen,
        f"{chosen.summary} from {chosen.windows:.1f} recent window(s); long memory says {long.correction.summary}",
    )


def _estimate(
    points: Sequence[CalibrationPoint], profile: DeviceProfile, model: str, now: float, options: RecalibrationOptions
) -> Estimate:
    usable = _usable(points, model, now, options)
    windows: dict[int, float] = {}
    for p, decay in usable:
        windows[p.window] = decay
    evidence_windows = sum(windows.values())
    evidence_executions = sum(p.executions * decay for p, decay in usable)
    if evidence_windows < options.min_windows or evidence_executions < options.min_executions:
        return Estimate(
            None,
            f"too little evidence: {evidence_windows:.1f} window(s) and {evidence_executions:.0f} execution(s) "
            f"after forgetting; needs {options.min_windows:g} and {options.min_executions:g}",
        )
    keys = {p.key for p, _ in usable}
    # the fitted V, K (not the corrected ones): the factors are relative to the fitted profile
    fitted = {key: _terms(profile, model, key) for key in keys}
    c_v = c_c = 1.0
    result: Correction | None = None
    for _ in range(options.iterations):
        rows = fitted
        if (c_v, c_c) != (1.0, 1.0):
            trial = Correction(model, "scale", c_v, c_c, 0.0, 0.0, 0, 0, 0.0)
            current = apply_corrections(profile, {model: trial})
            rows = {key: _terms(current, model, key) for key in keys}
        result = _fit(usable, rows, fitted, model, evidence_windows, options)
        if result is None:
            break
        c_v, c_c = result.factor, result.factor_constant
    if result is None:
        return Estimate(None, "every point lies outside the accepted range of factors; check the observations")
    for name, value in (("factor", result.factor), ("factor_constant", result.factor_constant)):
        if not MIN_FACTOR <= value <= MAX_FACTOR:
            return Estimate(
                None, f"{name} {value:.3g} is outside [{MIN_FACTOR:g}, {MAX_FACTOR:g}]; check the observations"
            )
    return Estimate(result, f"{result.summary} from {evidence_windows:.1f} window(s)")


def _fit(
    usable: Sequence[tuple[CalibrationPoint, float]],
    rows: Mapping[tuple[int, float, tuple[Neighbour, ...]], _Row],
    fitted: Mapping[tuple[int, float, tuple[Neighbour, ...]], _Row],
    model: str,
    evidence_windows: float,
    options: RecalibrationOptions,
) -> Correction | None:
    """One weighted fit at fixed A, B (see the module docstring)."""
    data = []  # (point, weight, y, A, B*V, B*K)
    for p, decay in usable:
        row, base = rows[p.key], fitted[p.key]
        x_v, x_c = row.b * base.v, row.b * base.k
        if x_v + x_c <= 0:
            continue
        data.append((p, p.executions * decay, p.observed_ms, row.a, x_v, x_c, decay))
    if not data:
        return None
    ratios = [(y - a) / (xv + xc) for _, _, y, a, xv, xc, _ in data]
    median = _weighted_median(ratios, [d[1] for d in data])
    if median <= 0:
        return None
    kept = [d for d, r in zip(data, ratios) if median / options.outlier_factor <= r <= median * options.outlier_factor]
    if not kept:
        return None
    # scale: one factor through the origin on relative residuals
    num = sum(w * (xv + xc) * (y - a) / (y * y) for _, w, y, a, xv, xc, _ in kept)
    den = sum(w * (xv + xc) ** 2 / (y * y) for _, w, y, a, xv, xc, _ in kept)
    scale = num / den if den > 0 else median
    c_v, c_c, mode = scale, scale, "scale"
    by_key: dict[tuple[int, float, tuple[Neighbour, ...]], float] = {}
    for p, _, _, _, _, _, decay in kept:
        by_key[p.key] = by_key.get(p.key, 0.0) + decay
    supported = [key for key, weight in by_key.items() if weight >= options.refit_min_windows]
    fractions = [fitted[key].v / (fitted[key].v + fitted[key].k) for key in supported if fitted[key].v + fitted[key].k]
    if (
        len(supported) >= options.refit_min_points
        and fractions
        and max(fractions) - min(fractions) >= (options.refit_min_spread)
    ):
        refit = _two_factors(kept)
        if refit is not None and all(MIN_FACTOR <= f <= MAX_FACTOR for f in refit):
            c_v, c_c, mode = refit[0], refit[1], "refit"
    total = sum(w for _, w, *_ in kept)
    residual = math.sqrt(sum(w * ((y - a - c_v * xv - c_c * xc) / y) ** 2 for _, w, y, a, xv, xc, _ in kept) / total)
    return Correction(
        model=model,
        mode=mode,
        factor=c_v,
        factor_constant=c_c,
        windows=evidence_windows,
        executions=total,  # each point's weight is its executions x its decay
        points=len(kept),
        distinct=len(by_key),
        residual=residual,
    )


def _two_factors(
    kept: Sequence[tuple[CalibrationPoint, float, float, float, float, float, float]],
) -> tuple[float, float] | None:
    """(c_v, c_c) minimising sum w ((y - A - c_v x_v - c_c x_c) / y)^2; None when singular."""
    s_vv = s_vc = s_cc = t_v = t_c = 0.0
    for _, w, y, a, xv, xc, _ in kept:
        u = w / (y * y)
        s_vv += u * xv * xv
        s_vc += u * xv * xc
        s_cc += u * xc * xc
        t_v += u * xv * (y - a)
        t_c += u * xc * (y - a)
    det = s_vv * s_cc - s_vc * s_vc
    if det <= 1e-12 * max(s_vv * s_cc, 1e-300):
        return None
    return (t_v * s_cc - t_c * s_vc) / det, (s_vv * t_c - s_vc * t_v) / det
