import json

import pytest

from interference.fit import RawProfileError, fit_measured_profile
from interference.latency import predict_gpu
from interference.profiling import MeasurePoint, ProfileSession
from stoke.cli import main


def truth(point: MeasurePoint) -> float:
    """A made-up CPU model: latency from the same k_act form, 30% slower with a busy neighbour."""
    k1, k2, k3, k4, k5 = 0.01, 40.0, 20.0, 5.0, 0.4
    base = (k1 * point.batch**2 + k2 * point.batch + k3) / (point.share_pct + k4) + k5
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
    session = ProfileSession(
        device="cpu-4core", cores=4, models=["a"], batches=[1, 8, 16, 32], model_bytes={"a": (256, 64)}
    )
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
    from interference.profile_io import BUNDLED_CPU_PROFILE, bundled_data_dir, load_profile
    from planner.solver import GpuType, Problem, Workload, solve

    profile = load_profile(bundled_data_dir() / BUNDLED_CPU_PROFILE)
    assert profile.gpu.share_step_pct == 50.0
    plan = solve(Problem((Workload("demo", "mlp_small", 50, 20),), (GpuType("cpu", 0.1, profile),)))
    assert plan.gpu_count == 1 and plan.slo_misses == ()


def test_stability_is_perf_analyzers_rule_three_windows_within_ten_percent():
    from interference.profiling import Stability

    rule = Stability()
    assert not rule.is_stable([10.0, 10.0])  # fewer than three windows
    assert rule.is_stable([50.0, 10.0, 10.5, 9.6])  # only the last three count
    assert not rule.is_stable([10.0, 10.0, 12.0])  # 12 is 12.5% above their mean
    assert rule.spread_pct([9.0, 10.0, 11.0]) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="max_windows >= windows"):
        Stability(max_windows=2)


def test_noisy_points_are_measured_again_until_stable():
    from interference.profiling import Stability, measure_until_stable

    asked = []
    noisy_then_steady = [30.0, 8.0, 14.0, 10.2, 9.8, 10.0, 99.0]

    def window(i):
        asked.append(i)
        return noisy_then_steady[i]

    m = measure_until_stable(window, Stability())
    assert asked == [0, 1, 2, 3, 4, 5] and m.windows == 6 and m.stable
    assert m.latency_ms == 10.0 and m.spread_pct < 2.0
    never = measure_until_stable(lambda i: 5.0 if i % 2 else 10.0, Stability(max_windows=7))
    assert never.windows == 7 and not never.stable and never.spread_pct > 10.0


def test_spread_and_eta_are_kept():
    from interference.profiling import MeasurePoint, eta_seconds

    session = ProfileSession(device="cpu-2core", cores=2, models=["a"], batches=[1])
    point = MeasurePoint("a", 50.0, 1)
    session.tell(point, 2.0, spread_pct=3.25)
    again = ProfileSession.from_dict(json.loads(json.dumps(session.to_dict())))
    assert again.spreads == {point.key: 3.25} and again.results == {point.key: 2.0}
    assert eta_seconds(30.0, 3, 9) == 90.0 and eta_seconds(0.0, 0, 9) is None


def test_non_monotone_points_are_measured_again_then_rejected_saying_which():
    """conv_medium's case: batch 8 slower at 100% than at 50%. It is asked again (max_retries times); still
    slower, it is rejected with the reason and left out of the fit. A point that comes right is kept."""
    session = ProfileSession(device="cpu-2core", cores=2, models=["a"], batches=[1, 8])
    slow = MeasurePoint("a", 100.0, 8)
    told: list[str] = []
    while (point := session.ask()) is not None:
        told.append(point.key)
        session.tell(point, truth(point) * (3.0 if point == slow else 1.0))
    assert told.count(slow.key) == 1 + session.max_retries and session.done
    assert list(session.rejected()) == [slow.key]
    why = session.rejected()[slow.key]
    assert "at share 100% is slower than" in why and "(batch 8)" in why and "after 2 re-measurement(s)" in why
    resumed = ProfileSession.from_dict(json.loads(json.dumps(session.to_dict())))
    assert resumed.rejected() == session.rejected() and resumed.done
    assert slow.key in resumed.excluded_from_fit()

    recovers = ProfileSession(device="cpu-2core", cores=2, models=["a"], batches=[1, 8])
    seen = 0
    while (point := recovers.ask()) is not None:
        seen += point == slow
        recovers.tell(point, truth(point) * (3.0 if point == slow and seen == 1 else 1.0))
    assert seen == 2 and recovers.rejected() == {} and recovers.excluded_from_fit() == {}


def test_a_point_left_out_of_the_latency_fit_still_gives_its_memory():
    """A busy CPU (one CI run): both points at 100% slower than at 50%, and batch 1 slower than batch 8.
    They leave the latency fit, one point is left, but the process's memory they read stands: the memory
    line still has two batch sizes (that run fitted weights of 0 MiB)."""
    session = ProfileSession(device="cpu-2core", cores=2, models=["a"], batches=[1, 8])
    slow = {MeasurePoint("a", 100.0, 1): 30.0, MeasurePoint("a", 100.0, 8): 3.0, MeasurePoint("a", 50.0, 1): 10.0}
    while (point := session.ask()) is not None:
        session.tell(point, truth(point) * slow.get(point, 1.0))
    for point in session.points():
        if point.neighbours == 0:
            session.memory_mib[point.key] = 200.0 + 2.0 * point.batch
    assert {p.key for p in slow} <= set(session.excluded_from_fit())
    model = fit_measured_profile(session).model("a")
    assert model.weights_mib == pytest.approx(200.0, abs=0.01) and model.activation_mib == pytest.approx(2.0, abs=0.01)


def test_a_faster_bigger_batch_is_suspected_too_and_the_slower_point_is_the_suspect():
    session = ProfileSession(device="cpu-1core", cores=1, models=["a"], batches=[1, 8, 16])
    for point, ms in zip(session.points(), (1.0, 5.0, 2.0)):  # batch 8 slower than batch 16
        session.tell(point, ms)
    assert list(session.non_monotone("a")) == ["a|100|8|0"]
    assert "a bigger batch must not be faster" in session.non_monotone("a")["a|100|8|0"]
    assert session.ask() == MeasurePoint("a", 100.0, 8)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("cores", 10**6, "field 'cores' must be a whole number from 1 to 100"),  # a million cores took 1.65 GB
        ("batches", [1, 10**9], "field 'batches' must be a non-empty list of whole numbers from 1 to 32"),
        ("models", ["../x"], "field 'models' must be a non-empty list of model names"),
        ("device", "\x1b[31mx", "field 'device' must be a device type name"),
    ],
)
def test_a_measurements_file_is_bounded_as_the_profile_it_fits(field, value, message):
    data = ProfileSession(device="cpu-2core", cores=2, models=["a"], batches=[1, 8]).to_dict()
    data[field] = value
    with pytest.raises(ValueError, match=message) as caught:
        ProfileSession.from_dict(data, "m.json")
    assert "\x1b" not in str(caught.value)
