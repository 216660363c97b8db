"""Homogeneous provisioner (Cynthia shape): pure, estimate-then-optimise.

Formulation. Pick one worker type t, n workers (1 <= n <= quota_t) and m
parameter servers (1 <= m <= ps.max_count) minimising

    cost = (n*price_t + m*price_ps) * T(t, n, m) / 3600   subject to   T <= deadline

with T from `training.models.predict_ps` (BSP or ASP, PS network and
PS CPU contention, iterations from the fitted loss curve). The PS type is
fixed by the spec, or "same" (PS on the worker type).

Bounds. Deadline: T >= k(n) * t_comp (no communication) falls with n when the
large-batch penalty kappa <= 1, so n_lower(t) = the first n where that bound
meets the deadline (a valid prune). PS saturation: n_sat(t, m) = the largest n
the m PS serve without becoming the bottleneck (network share >= the worker
link and CPU not overloaded); it is reported with the plan but not used to
prune, because under BSP more workers still shorten a PS-bound iteration's
compute share. The table inside the bounds is evaluated in one vectorised
call and the cheapest feasible row kept (ties: fewer machines, then faster).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from training.models import BOTTLENECK_TEXT, BOTTLENECKS, Array, TrainingError, predict_ps
from training.spec import TrainingPlan, TrainingSpec, WorkerOption


def _ps_figures(spec: TrainingSpec, worker: WorkerOption) -> tuple[float, float, float]:
    """(PS bandwidth, PS vCPUs, PS price) for workers of type `worker`."""
    if spec.ps.type == "same":
        return worker.network_mb_s, float(worker.vcpus), worker.price_per_hour
    return spec.ps.network_mb_s, float(spec.ps.vcpus), spec.ps.price_per_hour


def worker_bandwidth(spec: TrainingSpec, worker: WorkerOption) -> float:
    cap = spec.worker_bandwidth_cap_mb_s
    return min(worker.network_mb_s, cap) if cap else worker.network_mb_s


def compute_speed(spec: TrainingSpec, worker: WorkerOption, ps_bw: float) -> float:
    """R_worker: the profiled single-worker speed with its own push/pull removed."""
    single = 2.0 * spec.model_mb / min(worker_bandwidth(spec, worker), ps_bw)
    t_comp = worker.batch / worker.speed - single
    if t_comp <= 0:
        raise TrainingError(
            f"workers.{worker.type}.speed {worker.speed} is too high for model_mb "
            f"{spec.model_mb} at {min(worker_bandwidth(spec, worker), ps_bw)} MB/s: "
            f"batch/speed must exceed the push+pull time; check workers.{worker.type}.speed and gpu_batch, "
            "job.model_mb and the network bandwidths"
        )
    return worker.batch / t_comp


def candidate_table(spec: TrainingSpec) -> tuple[dict[str, Array], dict[str, int]]:
    """Every (type, n, m) inside the bounds with its prediction (arrays of equal length), and the lower
    bound on n of each type (from the deadline)."""
    cols: dict[str, list[Array]] = {}
    n_lower_by_type: dict[str, int] = {}
    for index, w in enumerate(spec.workers):
        if w.quota < 1:
            continue
        job = spec.ps_job(w.batch)
        ps_bw, ps_cpus, ps_price = _ps_figures(spec, w)
        speed = compute_speed(spec, w, ps_bw)
        ns = np.arange(1, w.quota + 1)
        # Deadline bound (valid when kappa <= 1): k(n) * t_comp <= deadline.
        lower = predict_ps(job, speed, np.inf, np.inf, 1.0, 0.0, 0.0, ns, 1.0)
        bound = lower["iterations"] * lower["t_comp"]
        if job.batch_penalty <= 1.0:
            ok = np.nonzero(bound <= spec.deadline_s)[0]
            n_lo = int(ns[ok[0]]) if len(ok) else w.quota + 1
        else:
            n_lo = 1
        n_lower_by_type[w.type] = n_lo
        n_grid, m_grid = np.meshgrid(
            np.arange(max(n_lo, 1), w.quota + 1), np.arange(1, spec.ps.max_count + 1), indexing="ij"
        )
        n_flat, m_flat = n_grid.ravel(), m_grid.ravel()
        if not len(n_flat):
            continue
        out = predict_ps(
            job, speed, worker_bandwidth(spec, w), ps_bw, ps_cpus, w.price_per_hour, ps_price, n_flat, m_flat
        )
        out["type_index"] = np.full(len(n_flat), index)
        out["n"], out["m"] = n_flat, m_flat
        for k, v in out.items():
            cols.setdefault(k, []).append(np.asarray(v))
    return {k: np.concatenate(v) for k, v in cols.items()}, n_lower_by_type


def ps_saturation(spec: TrainingSpec, type_name: str, m: int) -> int:
    """Largest n that m PS serve without being the bottleneck (0 if even one worker saturates them)."""
    w = spec.worker(type_name)
    ps_bw, ps_cpus, _ = _ps_figures(spec, w)
    bw_w = worker_bandwidth(spec, w)
    job = spec.ps_job(w.batch)
    speed = compute_speed(spec, w, ps_bw)
    ns = np.arange(1, max(w.quota, 1) * 4 + 1)
    t_comp = w.batch / speed
    t_comm = 2.0 * spec.model_mb / bw_w
    net_ok = m * ps_bw / ns >= bw_w if spec.sync == "bsp" else 2.0 * ns * spec.model_mb / (m * ps_bw) <= t_comp + t_comm
    cpu_ok = ns * spec.model_mb * job.update_cpu_s_per_mb / (m * ps_cpus) <= t_comp + t_comm
    ok = np.nonzero(~(net_ok & cpu_ok))[0]
    return int(ns[ok[0]] - 1) if len(ok) else int(ns[-1])


def provision_homogeneous(spec: TrainingSpec) -> TrainingPlan:
    """Cheapest (type, n, m) meeting the deadline; infeasible plans say by how much (see module doc)."""
    if not spec.workers or all(w.quota < 1 for w in spec.workers):
        raise TrainingError("spec has no worker type with quota >= 1; raise workers.<type>.quota")
    table, n_lower = candidate_table(spec)
    names = [w.type for w in spec.workers]
    total = len(table.get("n", ()))
    plan = partial(
        TrainingPlan,
        strategy="homogeneous",
        job=spec.name,
        deadline_s=spec.deadline_s,
        target_loss=spec.target_loss,
        candidates=total,
        search="exact",
    )
    details: dict[str, Any] = {"n_lower": n_lower, "sync": spec.sync}
    meets = (table["time"] <= spec.deadline_s + 1e-9) if total else np.zeros(0, dtype=bool)
    if meets.any():
        cost = np.where(meets, table["cost"], np.inf)
        best = int(np.lexsort((table["time"], table["n"] + table["m"], np.round(cost, 9)))[0])
        w = spec.workers[int(table["type_index"][best])]
        n, m = int(table["n"][best]), int(table["m"][best])
        code = BOTTLENECKS[int(table["bottleneck"][best])]
        details.update(
            {
                "iterations": int(table["iterations"][best]),
                "t_iter_s": round(float(table["t_iter"][best]), 6),
                "t_comp_s": round(float(table["t_comp"][best]), 6),
                "t_comm_s": round(float(table["t_comm"][best]), 6),
                "t_ps_cpu_s": round(float(table["t_cpu"][best]), 6),
                "ps_saturation_workers": ps_saturation(spec, w.type, m),
                "explanation": BOTTLENECK_TEXT[code],
            }
        )
        return plan(
            feasible=True,
            counts=tuple((t, n if t == w.type else 0) for t in names),
            ps_type=w.type if spec.ps.type == "same" else spec.ps.type,
            ps_count=m,
            predicted_time_s=float(table["time"][best]),
            predicted_cost=float(table["cost"][best]),
            bottleneck=code,
            details=details,
        )
    reason = _infeasible_reason(spec)
    return plan(
        feasible=False,
        counts=tuple((t, 0) for t in names),
        ps_type=spec.ps.type,
        ps_count=0,
        predicted_time_s=math.inf,
        predicted_cost=math.inf,
        reason=reason,
        details=details,
    )


def _infeasible_reason(spec: TrainingSpec) -> str:
    if spec.curve is not None and spec.target_loss <= spec.curve.beta2:
        return (
            f"target loss {spec.target_loss} is below the loss floor {spec.curve.beta2:.4g} of the fitted "
            f"curve; raise job.target_loss"
        )
    best_time, best_desc = math.inf, ""
    for w in spec.workers:
        if w.quota < 1:
            continue
        job = spec.ps_job(w.batch)
        ps_bw, ps_cpus, ps_price = _ps_figures(spec, w)
        speed = compute_speed(spec, w, ps_bw)
        n, m = np.meshgrid(np.arange(1, w.quota + 1), np.arange(1, spec.ps.max_count + 1), indexing="ij")
        out = predict_ps(
            job, speed, worker_bandwidth(spec, w), ps_bw, ps_cpus, w.price_per_hour, ps_price, n.ravel(), m.ravel()
        )
        i = int(np.argmin(out["time"]))
        if out["time"][i] < best_time:
            best_time = float(out["time"][i])
            best_desc = f"{int(n.ravel()[i])} x {w.type} with {int(m.ravel()[i])} PS"
    if not math.isfinite(best_time):
        return "no cluster within the quota reaches the target loss; raise job.target_loss"
    return (
        f"deadline {spec.deadline_s:.0f} s is {best_time - spec.deadline_s:.0f} s below what the quota can "
        f"reach (fastest: {best_time:.0f} s with {best_desc}); raise job.deadline_s to at least "
        f"{math.ceil(best_time)} or the quotas"
    )
