"""The serving path in p99: a profile field per model (old profiles load with the documented default),
one function adds it to the batching p99, and the planner and the plan's JSON and table carry it."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from control_helpers import cpu_profile

from interference.batching import end_to_end_p99_ms
from interference.profile import DEFAULT_BEYOND_SLI_P99_MS, DEFAULT_SERVING_P99_MS, DeviceProfile
from interference.profile_io import ProfileFileError, profile_from_dict, profile_to_dict
from interference.profiling import ProfileSession
from planner.solver import GpuType, Problem, ProblemError, Workload, plan_from_dict, plan_to_dict, solve
from stoke.commands.core import format_plan


def with_serving(profile: DeviceProfile, ms: float, beyond_ms: float = 0.0) -> DeviceProfile:
    return DeviceProfile(
        profile.gpu,
        {n: replace(m, serving_p99_ms=ms, beyond_sli_p99_ms=beyond_ms) for n, m in profile.models.items()},
    )


def test_end_to_end_p99_adds_the_serving_path_to_numbers_and_arrays():
    import numpy as np

    assert end_to_end_p99_ms(4.0, 1.5, 0.0) == pytest.approx(5.5, rel=1e-12)
    assert end_to_end_p99_ms(4.0, 1.5, 2.0) == pytest.approx(7.5, rel=1e-12)  # and what clients see beyond the SLI
    assert list(end_to_end_p99_ms(np.array([1.0, math.inf]), 2.0, 0.5)) == [3.5, math.inf]


def test_an_old_profile_without_the_field_loads_with_the_default_and_a_bad_value_is_refused():
    data = json.loads(json.dumps(profile_to_dict(cpu_profile())))
    for m in data["models"].values():
        m.pop("serving_p99_ms")
        m.pop("beyond_sli_p99_ms")
    old = profile_from_dict(data, "old.json")
    assert all(m.serving_p99_ms == DEFAULT_SERVING_P99_MS for m in old.models.values())
    assert DEFAULT_BEYOND_SLI_P99_MS == 0.0 and all(m.beyond_sli_p99_ms == 0.0 for m in old.models.values())
    measured = profile_from_dict(json.loads(json.dumps(profile_to_dict(with_serving(old, 2.5, 1.75)))), "new.json")
    assert all(m.serving_p99_ms == pytest.approx(2.5, rel=1e-12) for m in measured.models.values())
    assert all(m.beyond_sli_p99_ms == pytest.approx(1.75, rel=1e-12) for m in measured.models.values())
    for field in ("serving_p99_ms", "beyond_sli_p99_ms"):
        for bad, why in ((-1.0, "a number >= 0"), (1e9, "at most 60000 ms"), ("fast", "a number >= 0")):
            bad_data = json.loads(json.dumps(data))
            bad_data["models"]["mlp_small"][field] = bad
            with pytest.raises(ProfileFileError, match=rf"bad.json: models.mlp_small field '{field}'.*{why}") as err:
                profile_from_dict(bad_data, "bad.json")
            assert "stoke profile run" in str(err.value)  # what to do


def test_the_planner_adds_the_serving_path_to_each_replica_p99_and_shows_it():
    base = cpu_profile()
    workload = Workload("w", "mlp_small", 50.0, 40.0)
    plain = solve(Problem((workload,), (GpuType("CPU", 1.0, base),)), "stoke")
    slow = solve(Problem((workload,), (GpuType("CPU", 1.0, with_serving(base, 3.0, 1.5)),)), "stoke")
    (p0,), (p1,) = [[p for g in plan.gpus for p in g.placements] for plan in (plain, slow)]
    assert (p0.share_pct, p0.batch) == (p1.share_pct, p1.batch)  # a loose SLO: the same placement
    assert p1.predicted_p99_ms - p0.predicted_p99_ms == pytest.approx(4.5, rel=1e-6)  # both terms
    assert p1.serving_p99_ms == 3.0 and p0.serving_p99_ms == 0.0
    assert p1.beyond_sli_p99_ms == 1.5 and p0.beyond_sli_p99_ms == 0.0
    data = plan_to_dict(slow)
    assert data["gpus"][0]["workloads"][0]["serving_p99_ms"] == 3.0
    assert data["gpus"][0]["workloads"][0]["beyond_sli_p99_ms"] == 1.5
    assert plan_from_dict(data).gpus[0].placements[0].serving_p99_ms == 3.0
    assert plan_from_dict(data).gpus[0].placements[0].beyond_sli_p99_ms == 1.5
    old = json.loads(json.dumps(data))
    old["gpus"][0]["workloads"][0].pop("serving_p99_ms")
    old["gpus"][0]["workloads"][0].pop("beyond_sli_p99_ms")
    assert plan_from_dict(old).gpus[0].placements[0].serving_p99_ms == 0.0  # a plan from before
    assert plan_from_dict(old).gpus[0].placements[0].beyond_sli_p99_ms == 0.0
    table = format_plan(slow)
    assert "serving_ms" in table and "beyond_sli_ms" in table and "infer_ms: one batch's inference time" in table


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


def test_the_measurements_carry_the_part_beyond_the_sli_and_refuse_a_bad_one():
    from foundation.errors import InputError
    from interference.fit import fit_measured_profile
    from interference.profile_io import bundled_data_dir

    data = json.loads((bundled_data_dir() / "cpu-2core-measurements.json").read_text())
    data.pop("beyond_sli_p99_ms", None)  # a file from before the split: loads, nothing beyond the SLI
    old = ProfileSession.from_dict(json.loads(json.dumps(data)))
    assert old.beyond_sli_p99_ms == {}
    assert all(m.beyond_sli_p99_ms == DEFAULT_BEYOND_SLI_P99_MS for m in fit_measured_profile(old).models.values())
    data["beyond_sli_p99_ms"] = {"mlp_small": 2.25}
    session = ProfileSession.from_dict(json.loads(json.dumps(ProfileSession.from_dict(data).to_dict())))
    assert session.beyond_sli_p99_ms == {"mlp_small": 2.25}
    assert fit_measured_profile(session).models["mlp_small"].beyond_sli_p99_ms == 2.25
    for bad in (-0.5, 1e9, "slow", True, None):
        data["beyond_sli_p99_ms"] = {"mlp_small": bad}
        with pytest.raises(InputError, match=r"m.json: field 'beyond_sli_p99_ms' of 'mlp_small' must be a time in"):
            ProfileSession.from_dict(json.loads(json.dumps(data)), "m.json")
    data["beyond_sli_p99_ms"] = {"\x1b[31mnope": 1.0}
    with pytest.raises(InputError, match=r"names '\\x1b\[31mnope', not one of the models; delete the field"):
        ProfileSession.from_dict(data, "m.json")
    data["beyond_sli_p99_ms"] = [1.0]
    with pytest.raises(InputError, match="must be an object of model -> ms"):
        ProfileSession.from_dict(data, "m.json")
