"""The serving path in p99: a profile field per model (old profiles load with the documented default),
one function adds it to the batching p99, and the planner and the plan's JSON and table carry it."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from control_helpers import cpu_profile

from interference.batching import end_to_end_p99_ms
from interference.profile import DEFAULT_SERVING_P99_MS, DeviceProfile
from interference.profile_io import ProfileFileError, profile_from_dict, profile_to_dict
from interference.profiling import ProfileSession
from planner.solver import GpuType, Problem, ProblemError, Workload, plan_from_dict, plan_to_dict, solve
from stoke.commands.core import format_plan


def with_serving(profile: DeviceProfile, ms: float) -> DeviceProfile:
    return DeviceProfile(profile.gpu, {n: replace(m, serving_p99_ms=ms) for n, m in profile.models.items()})


def test_end_to_end_p99_adds_the_serving_path_to_numbers_and_arrays():
    import numpy as np

    assert end_to_end_p99_ms(4.0, 1.5) == pytest.approx(5.5, rel=1e-12)
    assert list(end_to_end_p99_ms(np.array([1.0, math.inf]), 2.0)) == [3.0, math.inf]


def test_an_old_profile_without_the_field_loads_with_the_default_and_a_bad_value_is_refused():
    data = json.loads(json.dumps(profile_to_dict(cpu_profile())))
    for m in data["models"].values():
        m.pop("serving_p99_ms")
    old = profile_from_dict(data, "old.json")
    assert all(m.serving_p99_ms == DEFAULT_SERVING_P99_MS for m in old.models.values())
    measured = profile_from_dict(json.loads(json.dumps(profile_to_dict(with_serving(old, 2.5)))), "new.json")
    assert all(m.serving_p99_ms == pytest.approx(2.5, rel=1e-12) for m in measured.models.values())
    for bad in (-1.0, 1e9, "fast"):
        data["models"]["mlp_small"]["serving_p99_ms"] = bad
        with pytest.raises(ProfileFileError, match=r"models.mlp_small field 'serving_p99_ms'"):
            profile_from_dict(data, "bad.json")


def test_the_planner_adds_the_serving_path_to_each_replica_p99_and_shows_it():
    base = cpu_profile()
    workload = Workload("w", "mlp_small", 50.0, 40.0)
    plain = solve(Problem((workload,), (GpuType("CPU", 1.0, base),)), "stoke")
    slow = solve(Problem((workload,), (GpuType("CPU", 1.0, with_serving(base, 3.0)),)), "stoke")
    (p0,), (p1,) = [[p for g in plan.gpus for p in g.placements] for plan in (plain, slow)]
    assert (p0.share_pct, p0.batch) == (p1.share_pct, p1.batch)  # a loose SLO: the same placement
    assert p1.predicted_p99_ms - p0.predicted_p99_ms == pytest.approx(3.0, rel=1e-6)
    assert p1.serving_p99_ms == 3.0 and p0.serving_p99_ms == 0.0
    data = plan_to_dict(slow)
    assert data["gpus"][0]["workloads"][0]["serving_p99_ms"] == 3.0
    assert plan_from_dict(data).gpus[0].placements[0].serving_p99_ms == 3.0
    old = json.loads(json.dumps(data))
    old["gpus"][0]["workloads"][0].pop("serving_p99_ms")
    assert plan_from_dict(old).gpus[0].placements[0].serving_p99_ms == 0.0  # a plan from before
    table = format_plan(slow)
    assert "serving_ms" in table and "infer_ms: one batch's inference time" in table


def test_a_serving_path_that_leaves_no_room_in_the_slo_rejects_the_workload_naming_it():
    base = cpu_profile()
    floor = min(m.active_time_ms(1, 100.0) for m in base.models.values() if m.name == "mlp_small")
    workload = Workload("w", "mlp_small", floor * 1.5 + 1.0, 1.0)
    solve(Problem((workload,), (GpuType("CPU", 1.0, base),)), "stoke")  # fits without the serving path
    with pytest.raises(ProblemError, match="of serving path"):
        solve(Problem((workload,), (GpuType("CPU", 1.0, with_serving(base, floor * 2 + 1.0)),)), "stoke")


def test_the_measurements_carry_the_serving_path_into_the_fitted_profile():
    from interference.fit import fit_measured_profile
    from interference.profile_io import bundled_data_dir

    data = json.loads((bundled_data_dir() / "cpu-2core-measurements.json").read_text())
    data["serving_p99_ms"] = {"mlp_small": 1.25}
    session = ProfileSession.from_dict(json.loads(json.dumps(ProfileSession.from_dict(data).to_dict())))
    assert session.serving_p99_ms == {"mlp_small": 1.25}
    profile = fit_measured_profile(session)
    assert profile.models["mlp_small"].serving_p99_ms == 1.25
    assert all(m.serving_p99_ms == DEFAULT_SERVING_P99_MS for n, m in profile.models.items() if n != "mlp_small")
