"""Training performance models and the published ResNet-110 spot case."""

from __future__ import annotations

import math

import numpy as np
import pytest

from training import readers
from training.models import LossCurve, PsJob, SpotJob, SpotLoss, TrainingError, evaluate_spot, predict_ps_one
from training.spec import spec_from_dict, with_overrides
from training.spot import SpotState, provision_spot


@pytest.fixture(scope="module")
def fixture_spec():
    data, source = readers.read_spec(None)
    return spec_from_dict(data, readers.offline_catalog(), source)


@pytest.mark.parametrize("search", ["exact", "window"])
def test_resnet110_published_case(fixture_spec, search):
    plan = provision_spot(fixture_spec, search=search)
    assert plan.feasible
    assert [c for _, c in plan.counts] == [2, 0, 2, 0, 0]
    assert [t for t, _ in plan.counts] == ["p3.2xlarge", "g4dn.4xlarge", "g3.8xlarge", "g3.16xlarge", "p2.8xlarge"]
    assert plan.predicted_time_s == pytest.approx(1884, abs=2)
    assert plan.predicted_cost == pytest.approx(1.68, abs=0.005)
    assert plan.predicted_time_s <= 1900
    assert plan.details["iterations"] == 10638


def test_infeasible_deadline_says_by_how_much(fixture_spec):
    plan = provision_spot(with_overrides(fixture_spec, deadline_s=900))
    assert not plan.feasible
    assert math.isinf(plan.predicted_time_s)
    # the fastest cluster the quota allows takes ~1437 s: 537 s more than the deadline
    assert "537 s below" in plan.reason and "raise job.deadline_s" in plan.reason


def test_unreachable_loss_is_explained(fixture_spec):
    plan = provision_spot(with_overrides(fixture_spec, target_loss=0.4))
    assert not plan.feasible and "loss floor" in plan.reason


def test_replan_keeps_survivors_and_adds_overhead(fixture_spec):
    state = SpotState(existing={"g3.16xlarge": 3}, revoked={"g3.8xlarge": 5}, remaining=0.6, replan=True)
    plan = provision_spot(fixture_spec, state)
    assert plan.feasible
    assert plan.count("g3.16xlarge") >= 3
    assert plan.count("g3.8xlarge") == 0  # all its capacity was revoked
    assert dict(plan.existing) == {"g3.16xlarge": 3}
    assert plan.details["recovery_overhead_s"] == 30
    assert plan.predicted_time_s <= fixture_spec.deadline_s


def _spot_job(**kw) -> SpotJob:
    base = dict(
        model_mb=11.5,
        ps_bw_mb_s=1200,
        required_bw_mb_s=142,
        pcie_bw_mb_s=10000,
        a1=0.8,
        b1=-1.92,
        loss=SpotLoss(876.5, -0.2, 2507.6, 1.0, 0.5, r_weight=1.0),
        target_loss=0.9,
    )
    base.update(kw)
    return SpotJob(**base)


def test_spot_homogeneous_convergence_coefficient():
    job = _spot_job()
    for n in (1, 2, 4, 7):
        out = evaluate_spot(job, [1024], [0.4], [1], [1.0], [[n]])
        assert out["R"][0] == pytest.approx(math.sqrt(1 - 1 / n))
        assert out["b_w"][0] == pytest.approx(1024)


def test_spot_weighted_batch_and_expected_iteration_time():
    job = _spot_job()
    out = evaluate_spot(job, [512, 2048], [0.2, 1.0], [1, 4], [1.0, 2.0], [[1, 1]])
    t = job.iteration_times([0.2, 1.0], [1, 4], 2)
    assert out["t_exp"][0] == pytest.approx(1 / (1 / t[0] + 1 / t[1]))
    assert out["b_w"][0] == pytest.approx((512 / t[0] + 2048 / t[1]) / (1 / t[0] + 1 / t[1]))
    # heterogeneous shares: R between 0 and 1
    assert 0 < out["R"][0] < 1


def test_spot_contention_only_when_ps_is_shared():
    job = _spot_job()
    assert job.worker_bandwidth(4) == pytest.approx(142)  # 1200/4 = 300 > 142: no contention
    p = min(0.8 * math.sqrt(12) - 1.92, 1)
    assert job.worker_bandwidth(12) == pytest.approx(p * 100 + (1 - p) * 142)
    assert job.max_workers() == 13


def test_spot_compute_time_rejects_impossible_speed():
    with pytest.raises(TrainingError):
        _spot_job().compute_time([16], [10000])


CURVE = LossCurve(beta0=1e-6, beta1=0.25, beta2=0.5)


def _ps(**kw) -> PsJob:
    base = dict(model_mb=100.0, batch_per_worker=64, curve=CURVE, target_loss=0.9, sync="bsp", update_cpu_s_per_mb=0.0)
    base.update(kw)
    return PsJob(**base)


def test_ps_worker_compute_bound():
    pred = predict_ps_one(
        _ps(model_mb=1.0),
        worker_speed=100,
        worker_bw_mb_s=1000,
        ps_bw_mb_s=1000,
        ps_cpus=8,
        worker_price=1.0,
        ps_price=0.5,
        n=2,
        m=1,
    )
    assert pred.bottleneck == "worker_compute"
    assert pred.t_iter_s == pytest.approx(0.64 + 2 * 1.0 / 500)  # 2 workers share one PS link
    samples = (1 / 0.4 - 0.25) / 1e-6
    assert pred.iterations == math.ceil(samples / 128)
    assert pred.cost == pytest.approx((2 * 1.0 + 0.5) * pred.time_s / 3600)


def test_ps_network_bound_when_workers_share_one_ps():
    pred = predict_ps_one(
        _ps(),
        worker_speed=1000,
        worker_bw_mb_s=1000,
        ps_bw_mb_s=1000,
        ps_cpus=8,
        worker_price=1.0,
        ps_price=0.5,
        n=8,
        m=1,
    )
    assert pred.bottleneck == "ps_network"
    assert pred.t_comm_s == pytest.approx(2 * 100 / (1000 / 8))
    more_ps = predict_ps_one(_ps(), 1000, 1000, 1000, 8, 1.0, 0.5, n=8, m=4)
    assert more_ps.t_iter_s < pred.t_iter_s


def test_ps_cpu_bound_stretches_iteration():
    pred = predict_ps_one(
        _ps(update_cpu_s_per_mb=0.05),
        worker_speed=1000,
        worker_bw_mb_s=10000,
        ps_bw_mb_s=10000,
        ps_cpus=2,
        worker_price=1.0,
        ps_price=0.5,
        n=8,
        m=1,
    )
    assert pred.bottleneck == "ps_cpu"
    assert pred.t_iter_s == pytest.approx(8 * 100 * 0.05 / 2)


def test_asp_ps_link_bound():
    pred = predict_ps_one(
        _ps(sync="asp"),
        worker_speed=1000,
        worker_bw_mb_s=1000,
        ps_bw_mb_s=1000,
        ps_cpus=8,
        worker_price=1.0,
        ps_price=0.5,
        n=16,
        m=1,
    )
    assert pred.bottleneck == "ps_network"
    assert pred.t_iter_s == pytest.approx(2 * 16 * 100 / 1000)


def test_loss_curve_inverse_and_floor():
    s = CURVE.samples_for(0.9)
    assert CURVE.loss(s) == pytest.approx(0.9)
    assert math.isinf(CURVE.samples_for(0.5))
    loss = SpotLoss(876.5, -0.2, 2507.6, 1.0, 0.5, r_weight=0.0)
    j = float(loss.iterations(1024, 0.3, 4, 0.9))
    assert float(loss.loss(1024, 0.3, 4, j)) == pytest.approx(0.9)
    assert np.isinf(loss.iterations(1024, 0.3, 4, 0.5))


def test_a_contention_fit_saturated_at_one_worker_is_refused():
    from training.models import TrainingError

    with pytest.raises(TrainingError, match=r"a1 \+ b1"):
        _spot_job(a1=0.5, b1=0.6)


def test_spot_plans_need_a_real_parameter_server_type(fixture_spec):
    import dataclasses

    from training.spec import TrainingError

    same = dataclasses.replace(fixture_spec, ps=dataclasses.replace(fixture_spec.ps, type="same"))
    with pytest.raises(TrainingError, match="ps.type"):
        provision_spot(same)


# --------------------------------------------------------------------------- SPEC.yaml checks


def _fixture_data() -> dict:
    return readers.read_spec(None)[0]


def _load(data: dict):
    return spec_from_dict(data, readers.offline_catalog(), "SPEC.yaml")


@pytest.mark.parametrize(
    ("path", "known"),
    [
        ("colour", "homogeneous, job, ps, spot, workers"),
        ("job.colour", "deadline_s, model_mb, name, sync, target_loss"),
        ("workers.p3.2xlarge.colour", "gpu_batch, network_mb_s, price_per_hour, quota, speed"),
        ("ps.colour", "max_count, network_mb_s, price_per_hour, type, vcpus"),
        ("spot.recovery_overhead", "contention, loss, pcie_mb_s, ps_bandwidth_mb_s, recovery_overhead_s"),
        ("spot.contention.a2", "a1, b1"),
        ("spot.loss.g6", "g1, g2, g3, g4, g5, r_weight"),
        ("homogeneous.curve.beta3", "beta0, beta1, beta2"),
        ("homogeneous.batch_penality", "batch_penalty, curve, reference_batch"),
    ],
)
def test_an_unknown_or_misspelt_key_is_refused_at_every_level(path, known):
    """A misspelt key used to fall back to its default silently (recovery_overhead: 300 planned with 30 s)."""
    data = _fixture_data()
    *parents, key = path.split(".") if not path.startswith("workers.") else ["workers", "p3.2xlarge", "colour"]
    node = data
    for part in parents:
        node = node[part]
    node[key] = 300
    with pytest.raises(
        TrainingError, match=r"^SPEC.yaml: unknown key '" + path.replace(".", r"\.") + "'; known keys: "
    ) as err:
        _load(data)
    assert known in str(err.value)


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        (("workers", "p3.2xlarge", "gpu_batch"), 0.5, "workers.p3.2xlarge.gpu_batch must be a whole number >= 1"),
        (("workers", "p3.2xlarge", "gpu_batch"), 0, "workers.p3.2xlarge.gpu_batch must be a whole number >= 1"),
        (("workers", "p3.2xlarge", "quota"), 2.5, "workers.p3.2xlarge.quota must be a whole number >= 0 up to 1,000"),
        (("workers", "p3.2xlarge", "quota"), 10**6, "workers.p3.2xlarge.quota must be a whole number >= 0 up to 1,000"),
        (("job", "model_mb"), 1e12, "job.model_mb must be a positive number up to 1e+06, got 1000000000000.0"),
        (("job", "deadline_s"), 1e10, "job.deadline_s must be a positive number of seconds up to 1e+07"),
        (("ps", "max_count"), 2.5, "ps.max_count must be a whole number >= 1 up to 64"),
        (("spot", "recovery_overhead_s"), -1, "spot.recovery_overhead_s must be a number >= 0 up to 1e+07"),
        (("spot", "loss", "g1"), 1e300, "spot.loss.g1 must be a number from -1e+12 to 1e+12"),
        (("job", "sync"), "ssp", "job.sync must be one of asp, bsp"),
    ],
)
def test_every_number_is_checked_with_its_field_named(where, value, message):
    data = _fixture_data()
    node = data
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    with pytest.raises(TrainingError) as err:
        _load(data)
    assert str(err.value).startswith("SPEC.yaml: " + message), err.value
    assert "2*S/B_req" not in str(err.value)


def test_a_spot_section_that_leaves_no_compute_time_names_the_fields():
    """batch/speed must exceed the push and pull at B_req: said at load, not by the model's formula."""
    data = _fixture_data()
    data["job"]["model_mb"] = 1000
    with pytest.raises(TrainingError) as err:
        _load(data)
    text = str(err.value)
    assert text.startswith("SPEC.yaml: workers.p3.2xlarge: ") and "job.model_mb" in text
    assert "spot.required_bandwidth_mb_s" in text and "2*S/B_req" not in text


def test_quota_zero_everywhere_is_refused_instead_of_blaming_running_instances():
    data = _fixture_data()
    for w in data["workers"].values():
        w["quota"] = 0
    with pytest.raises(TrainingError, match=r"^SPEC.yaml: workers: every instance type has quota 0"):
        _load(data)


def test_a_revoked_out_quota_is_not_blamed_on_running_instances(fixture_spec):
    revoked = {w.type: w.quota for w in fixture_spec.workers}
    plan = provision_spot(fixture_spec, SpotState(revoked=revoked, replan=True))
    assert not plan.feasible and "already running" not in plan.reason and "quota" in plan.reason


@pytest.mark.parametrize("name", ["a/b\x1b[31mX", "a b", "..", "-x", 5])
def test_job_and_instance_type_names_follow_the_name_rule(name):
    data = _fixture_data()
    data["job"]["name"] = name
    with pytest.raises(TrainingError, match=r"^SPEC.yaml: job.name must be a name") as err:
        _load(data)
    assert "\x1b" not in str(err.value)
    data = _fixture_data()
    data["workers"] = {name: data["workers"]["p3.2xlarge"]}
    with pytest.raises(TrainingError, match=r"^SPEC.yaml: workers: instance type must be a name") as err:
        _load(data)
    assert "\x1b" not in str(err.value)


def test_the_spot_strategy_refuses_a_bsp_job(fixture_spec):
    import dataclasses

    with pytest.raises(TrainingError, match=r"job.sync is 'bsp'.*ASP.*--strategy homogeneous"):
        provision_spot(dataclasses.replace(fixture_spec, sync="bsp"))


def test_cli_plan_refuses_bsp_with_spot_and_bad_specs_in_one_line(capsys, tmp_path):
    import yaml

    from stoke.cli import main

    data = _fixture_data()
    data["job"]["sync"] = "bsp"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    assert main(["train", "plan", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}: job.sync is 'bsp'" in err and "--strategy homogeneous" in err and err.count("\n") == 1
    assert main(["train", "plan", str(spec), "--strategy", "homogeneous", "--json"]) == 0
    capsys.readouterr()
    data["job"]["sync"] = "asp"
    data["spot"]["recovery_overhead"] = 300
    spec.write_text(yaml.safe_dump(data))
    assert main(["train", "plan", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'spot.recovery_overhead'" in err and "recovery_overhead_s" in err
    assert main(["train", "plan", "--deadline", "1e12"]) == 2
    assert "--deadline must be a positive number up to 1e+07" in capsys.readouterr().err


def test_a_plan_json_with_unsafe_names_is_refused(tmp_path):
    from training.spec import training_plan_from_dict, training_plan_to_dict

    body = training_plan_to_dict(provision_spot(_load(_fixture_data())))
    for key, value in (("job", "a/b\x1b[31mX"), ("counts", {"a/b\x1b[31mX": 1}), ("strategy", "other")):
        with pytest.raises(TrainingError, match=rf"^PLAN.json: {key}") as err:
            training_plan_from_dict({**body, key: value})
        assert "\x1b" not in str(err.value)


def test_a_plan_an_earlier_stoke_wrote_under_any_job_name_is_still_read_for_terminate():
    """An earlier stoke took any job name and tagged the cluster's instances with it: a plan of `ResNet 110 (run 2)`
    must still be read, or `train terminate PLAN` could never stop those instances. Unprintable text is refused."""
    from training.spec import training_plan_from_dict, training_plan_to_dict

    body = training_plan_to_dict(provision_spot(_load(_fixture_data())))
    assert training_plan_from_dict({**body, "job": "ResNet 110 (run 2)"}).job == "ResNet 110 (run 2)"
    for bad in ("", "a\x1b[31m", "x" * 257, 5):
        with pytest.raises(TrainingError, match="printable text of 1-256 characters"):
            training_plan_from_dict({**body, "job": bad})
