import json

import pytest

from interference.fit import RawProfileError, fit_measured_profile
from interference.latency import predict_gpu
from interference.profiling import MeasurePoint, ProfileSession
from stoke.cli import main


def truth(point: MeasurePoint) -> float:
    """A made-up CPU model: latency from the same k_act form, 30% slower with a busy neighbour."""
    k1, k2, k3, k4, k5 = 0.01, 40.0, 20.0, 5.0, 0.4
    base = (k1 * point.batch ** 2 + k2 * point.batch + k3) / (point.share_pct + k4) + k5
    return base * (1.3 if point.neighbours else 1.0)


def run_to_end(session: ProfileSession, stop_after: int | None = None) -> int:
    told = 0
    while (point := session.ask()) is not None and (stop_after is None or told < stop_after):
        session.tell(point, truth(point))
        told += 1
    return told


def test_ask_tell_checkpoint_and_resume_measure_each_point_once():
    session = ProfileSession(device="cpu-4core", cores=4, models=["a", "b"], batches=[1, 8, 32])
    assert session.progress() == (0, 2 * 4 * 3 + 2)
    run_to_end(session, stop_after=7)
    resumed = ProfileSession.from_dict(json.loads(json.dumps(session.to_dict())))
    assert resumed.progress() == (7, 26)
    assert run_to_end(resumed) == 19 and resumed.done


def test_fitted_profile_predicts_the_measured_latencies():
    session = ProfileSession(device="cpu-4core", cores=4, models=["a"], batches=[1, 8, 16, 32],
                             model_bytes={"a": (256, 64)})
    run_to_end(session)
    profile = fit_measured_profile(session)
    assert profile.gpu.share_step_pct == 25.0
    for point in session.points():
        if not point.neighbours:
            predicted = predict_gpu(profile, [("a", point.batch, point.share_pct)])[0].latency_ms
            assert predicted == pytest.approx(truth(point), rel=0.03)
    pair = predict_gpu(profile, [("a", 8, 25.0), ("a", 8, 25.0)])[0].latency_ms
    assert pair == pytest.approx(truth(MeasurePoint("a", 25.0, 8, 1)), rel=0.03)


def test_incomplete_measurements_are_refused(tmp_path, capsys):
    session = ProfileSession(device="cpu-2core", cores=2, models=["a"])
    run_to_end(session, stop_after=3)
    with pytest.raises(RawProfileError, match="incomplete"):
        fit_measured_profile(session)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(session.to_dict()))
    assert main(["profile", "fit", str(path), "-o", str(tmp_path / "p.json")]) == 2
    assert "incomplete (3/9 points)" in capsys.readouterr().err


def test_bundled_cpu_profile_loads_and_plans():
    from pathlib import Path

    from controller.solver import GpuType, Problem, Workload, solve
    from interference.profile_io import load_profile
    profile = load_profile(Path(__file__).resolve().parents[2] / "triton_repo" / "profiles" / "cpu-2core-profile.json")
    assert profile.gpu.share_step_pct == 50.0
    plan = solve(Problem((Workload("demo", "mlp_small", 50, 20),), (GpuType("cpu", 0.1, profile),)))
    assert plan.gpu_count == 1 and plan.slo_misses == ()
