"""The `stoke` CLI end to end (in-process main(), real files)."""

import json
import os
import stat

import pytest
from floats import PROFILE_ROUNDED, assert_close

from interference.profile import UNMEASURED_ERROR
from interference.profile_io import bundled_profile, bundled_raw_path, load_profile, profile_to_dict
from stoke.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_defaults_print_a_table(capsys):
    code, out, _ = run(capsys, "plan")
    assert code == 0
    assert "strategy stoke" in out and "photo-tagging" in out and "share_%" in out


@pytest.mark.slow
def test_plan_json_has_the_documented_shape(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", "--json", "--strategy", "igniter", "--plot", str(tmp_path / "p.png"))
    assert code == 0
    data = json.loads(out)
    assert data["strategy"] == "igniter" and data["gpu_count"] == len(data["gpus"])
    assert data["cost_per_hour"] == pytest.approx(3.06 * data["gpu_count"])
    entry = data["gpus"][0]["workloads"][0]
    assert {
        "name",
        "model",
        "slo_ms",
        "rate_rps",
        "share_pct",
        "batch",
        "predicted_latency_ms",
        "predicted_p99_ms",
        "p99_slo_ratio",
        "binding",
        "predicted_throughput_rps",
    } <= set(entry)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_predict_adds_predictions_to_each_line(capsys, tmp_path):
    cases = tmp_path / "cases.jsonl"
    cases.write_text(
        json.dumps(
            [{"model": "vgg19", "batch": 6, "share_pct": 37.5}, {"model": "alexnet", "batch": 4, "share_pct": 10}]
        )
        + "\n"
    )
    code, out, _ = run(capsys, "predict", "--cases", str(cases), "--json")
    assert code == 0
    [line] = out.strip().splitlines()
    result = json.loads(line)
    assert [r["model"] for r in result] == ["vgg19", "alexnet"]
    assert all(r["predicted_latency_ms"] > 0 and r["predicted_throughput_rps"] > 0 for r in result)


def test_predict_flags_points_outside_the_profile_s_domain_and_reads_its_own_output_back(capsys, tmp_path):
    """alexnet was measured at shares 10-100%: 5% is extrapolated (the planner does not go there unasked), which
    the table, the JSON and a warning say; predict's JSON output is a valid input again."""
    cases = tmp_path / "cases.jsonl"
    points = [{"model": "alexnet", "batch": 4, "share_pct": share} for share in (5, 50)]
    cases.write_text(json.dumps(points) + "\n")
    code, out, err = run(capsys, "predict", "--cases", str(cases))
    assert code == 0 and "OUTSIDE" in out and "inside" in out
    assert "1 point(s) lie outside the shares and batches the profile measured" in err
    code, out, _ = run(capsys, "predict", "--cases", str(cases), "--json")
    assert [r["in_domain"] for r in json.loads(out)] == [False, True]
    cases.write_text(out)
    code, again, _ = run(capsys, "predict", "--cases", str(cases), "--json")
    assert code == 0 and json.loads(again) == json.loads(out)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ({"model": "vgg19", "batch": 100000, "share_pct": 50}, "'batch' must be a whole number from 1 to 32"),
        ({"model": "vgg19", "batch": 4, "share_pct": 1e-9}, "'share_pct' must be from 2.5 (one share step"),
        ({"model": "vgg19", "batch": 4, "share_pct": 50, "shares": 1}, "entry 0 has unknown field 'shares'"),
        (None, "no case; each line is one GPU"),
    ],
)
def test_predict_refuses_points_no_profile_describes(capsys, tmp_path, case, message):
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps([case]) + "\n" if case else "\n")
    code, _, err = run(capsys, "predict", "--cases", str(cases))
    assert code == 2 and message in err


def test_predict_refuses_a_repeated_key(capsys, tmp_path):
    cases = tmp_path / "cases.jsonl"
    cases.write_text('[{"model": "vgg19", "batch": 4, "share_pct": 50}]\n[{"model": "alexnet", "model": "vgg19"}]\n')
    code, out, err = run(capsys, "predict", "--cases", str(cases))
    assert code == 2 and out == ""  # it predicted vgg19 for the second line
    assert err == f"stoke: error: {cases}:2: key 'model' repeated (in [0]); keep one\n"


def test_a_plan_with_a_repeated_key_is_refused(capsys, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text('{"gpu_count": 0, "cost_per_hour": 0, "gpus": [], "gpus": [], "strategy": "stoke"}')
    for argv in (["simulate", str(plan), "--seconds", "1"], ["profile", "verify", str(plan)]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "", argv
        assert err == f"stoke: error: {plan}: key 'gpus' repeated (at the top level); keep one\n", argv


@pytest.mark.slow
def test_simulate_a_plan_file(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", "--json")
    (tmp_path / "plan.json").write_text(out)
    code, out, _ = run(capsys, "simulate", str(tmp_path / "plan.json"), "--seconds", "3", "--json")
    assert code == 0
    report = json.loads(out)
    assert len(report["workloads"]) == 8 and 0 <= report["attainment"] <= 1


def test_simulate_replays_a_plan_on_the_profile_it_was_planned_with(capsys, tmp_path):
    """A plan records each GPU type's profile: replayed on another (the bundled V100's for a slower device) it is
    refused, naming the way out; on its own (--profile FILE or TYPE=FILE) its p99 is the one planned."""
    data = profile_to_dict(bundled_profile())
    for m in data["models"].values():
        m["k_act"] = [k * 1.6 for k in m["k_act"]]
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(data))
    workloads = tmp_path / "w.yaml"
    workloads.write_text(
        f"gpu_types: [{{name: V100, price_per_hour: 3.06, profile: {slow}}}]\n"
        "workloads:\n  - {name: a, model: resnet50, slo_ms: 40, rate_rps: 400}\n"
    )
    code, out, err = run(capsys, "plan", str(workloads), "--json")
    assert code == 0, err
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    (planned,) = [w["predicted_p99_ms"] for g in json.loads(out)["gpus"] for w in g["workloads"]]
    code, _, err = run(capsys, "simulate", str(plan), "--seconds", "3")
    assert code == 2 and "GPU type 'V100' was planned with another profile than the bundled V100 profile" in err
    assert "--profile V100=FILE" in err
    for given in (str(slow), f"V100={slow}"):
        code, out, err = run(capsys, "simulate", str(plan), "--seconds", "5", "--profile", given, "--json")
        assert code == 0, err
        (replayed,) = [w["p99_ms"] for w in json.loads(out)["workloads"]]
        assert replayed == pytest.approx(planned, rel=0.15), (replayed, planned)  # the bundled one gave 0.4x
    code, _, err = run(capsys, "simulate", str(plan), "--profile", f"A100={slow}")
    assert code == 2 and "has no GPU type 'A100' (its types: V100)" in err
    # verification re-plans on the simulated device's V100 profile: not a plan made for another (refused at once)
    code, _, err = run(capsys, "profile", "verify", str(plan))
    assert code == 2 and "was planned with another profile than the simulated device's" in err, err


def test_a_plan_s_recorded_profiles_round_trip_and_bad_ones_are_refused():
    from planner.solver import ProblemError, plan_from_dict, plan_to_dict

    digest = "ab" * 32
    data = {"strategy": "stoke", "gpus": [], "profiles": {"V100": digest}}
    assert plan_from_dict(data).profiles == (("V100", digest),)
    assert plan_to_dict(plan_from_dict(data))["profiles"] == {"V100": digest}
    assert "profiles" not in plan_to_dict(plan_from_dict({"strategy": "stoke", "gpus": []}))  # older plans
    for bad in ({"V100": "xyz"}, {"a/b": digest}, ["V100"]):
        with pytest.raises(ProblemError, match="profiles|GPU type"):
            plan_from_dict({**data, "profiles": bad})


def _no_nan(token: str) -> float:
    raise AssertionError(f"{token} is not JSON")


def test_simulating_an_empty_plan_says_so_and_writes_json_without_nan(capsys, tmp_path):
    plan = tmp_path / "empty.json"
    plan.write_text(json.dumps({"gpu_count": 0, "cost_per_hour": 0, "gpus": [], "strategy": "stoke"}))
    code, out, _ = run(capsys, "simulate", str(plan), "--seconds", "1")
    assert code == 0 and "the plan places no workload" in out and "nan" not in out
    code, out, _ = run(capsys, "simulate", str(plan), "--seconds", "1", "--json")
    report = json.loads(out, parse_constant=_no_nan)  # NaN, Infinity: no JSON parser but Python's reads them
    assert code == 0 and report["workloads"] == [] and report["p99_slo_ratio"]["median"] is None


def test_a_workload_that_sent_no_request_is_shown_unmeasured_not_ok(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", "--json")
    plan = json.loads(out)
    for gpu in plan["gpus"]:
        for w in gpu["workloads"]:
            w["rate_rps"] = 0.01  # about no request in a simulated second
    (tmp_path / "slow.json").write_text(json.dumps(plan))
    argv = ("simulate", str(tmp_path / "slow.json"), "--seconds", "1", "--min-requests", "0")
    code, out, _ = run(capsys, *argv)
    assert code == 0 and "no workload sent a request: raise --seconds or --min-requests" in out
    assert "nan" not in out and " ok" not in out and out.count("no requests") == 8
    code, out, _ = run(capsys, *argv, "--json")
    report = json.loads(out, parse_constant=_no_nan)
    assert all(w["requests"] == 0 and w["p99_ms"] is None for w in report["workloads"])


def test_profile_fit_writes_a_loadable_profile(capsys, tmp_path):
    out_path = tmp_path / "v100.json"
    code, out, _ = run(capsys, "profile", "fit", str(bundled_raw_path()), "-o", str(out_path))
    assert code == 0 and "alexnet" in out
    assert_close(profile_to_dict(load_profile(out_path)), profile_to_dict(bundled_profile()), abs_tol=PROFILE_ROUNDED)


def test_a_missing_workload_file_says_what_to_do(capsys, tmp_path):
    code, out, err = run(capsys, "plan", str(tmp_path / "nope.yaml"))
    assert code == 2 and not out
    assert "nope.yaml: cannot read workload file (No such file or directory); check the path" in err
    assert "without an argument stoke plan uses the bundled example" in err


def test_explain_of_an_unknown_workload_fails_before_printing_the_plan(capsys):
    code, out, err = run(capsys, "plan", "--explain", "nope")
    assert code == 2 and out == ""
    assert err.startswith("stoke: error: --explain: no workload 'nope' in the bundled example workloads; workloads:")
    assert "photo-tagging" in err


def test_profile_fit_shows_coefficients_to_four_significant_figures(capsys, tmp_path):
    code, out, _ = run(capsys, "profile", "fit", str(bundled_raw_path()), "-o", str(tmp_path / "p.json"))
    assert code == 0
    lines = out.splitlines()
    header = lines[0].split()
    assert header == ["model", "kernels", "k1", "k2", "k3", "k4", "k5", "alpha_cache"]
    # the profile this very fit wrote (not the bundled one: its last digits follow another machine's BLAS)
    profile = load_profile(tmp_path / "p.json")
    for line in lines[2 : 2 + len(profile.models)]:
        name, _, *cells = line.split()
        m = profile.models[name]
        for cell, value in zip(cells, [*m.k_act, m.cache_sensitivity]):
            assert cell == f"{value:.4g}"  # never a nonzero coefficient rounded to 0.00


@pytest.mark.parametrize(
    "content, expected",
    [
        ("workloads:\n  - {name: a, model: bert, slo_ms: 10, rate_rps: 5}\n", "model 'bert' is not profiled"),
        (
            "workloads:\n  - {name: a, model: vgg19, slo_ms: 10, rate_rps: -5}\n",
            "workloads[0].rate_rps must be a positive number up to 1e+06, got -5",
        ),
        (  # issue 10: 1e308 passed as "a positive number" and stopped every plan
            "workloads:\n  - {name: a, model: vgg19, slo_ms: 10, rate_rps: 1.0e+308}\n",
            "workloads[0].rate_rps must be a positive number up to 1e+06, got 1e+308",
        ),
        ("workloads:\n  - {name: '..', model: vgg19, slo_ms: 10, rate_rps: 5}\n", "workloads[0].name must be a name"),
        (  # a terminal escape in a name is refused, and echoed escaped
            'workloads:\n  - {name: "a\\e[31m", model: vgg19, slo_ms: 10, rate_rps: 5}\n',
            "got 'a\\x1b[31m'",
        ),
        ("workloads: [\n  - {name: a\n", "malformed YAML at line"),
        ("workloads:\n  - {name: a, model: vgg19, rate_rps: 5}\n", "workloads[0] lacks field 'slo_ms'"),
        (  # the last value won: planned for 1500 ms, no word said
            "workloads:\n  - name: a\n    model: vgg19\n    slo_ms: 15\n    slo_ms: 1500\n    rate_rps: 5\n",
            "line 5: key 'slo_ms' repeated (in workloads[0], first at line 4); keep one",
        ),
        (  # the second block dropped the first
            "workloads:\n  - {name: a, model: vgg19, slo_ms: 60, rate_rps: 5}\n"
            "workloads:\n  - {name: b, model: vgg19, slo_ms: 60, rate_rps: 5}\n",
            "line 3: key 'workloads' repeated (at the top level, first at line 1); keep one",
        ),
    ],
)
def test_bad_workload_files_give_one_clear_line_and_exit_2(capsys, tmp_path, content, expected):
    path = tmp_path / "w.yaml"
    path.write_text(content)
    code, out, err = run(capsys, "plan", str(path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and str(path) in err and expected in err


def test_a_workload_file_that_is_not_utf8_is_one_clear_line(capsys, tmp_path):
    path = tmp_path / "w.yaml"
    path.write_bytes(b"workloads:\n  - {name: caf\xe9, model: vgg19, slo_ms: 10, rate_rps: 5}\n")
    code, out, err = run(capsys, "plan", str(path))
    assert code == 2 and err.count("\n") == 1
    assert f"{path}: not UTF-8 text (byte 0xe9 at offset" in err and "save it as UTF-8" in err


def test_profile_missing_a_field_is_named(capsys, tmp_path):
    data = profile_to_dict(bundled_profile())
    del data["gpu"]["power_cap_w"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    code, _, err = run(capsys, "plan", "--profile", str(path))
    assert code == 2 and "gpu lacks field 'power_cap_w'" in err and str(path) in err
    code, _, err = run(capsys, "profile", "fit", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "x.json"))
    assert code == 2 and "cannot read raw profile" in err


def test_impossible_slo_exits_2_naming_workload(capsys, tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("workloads:\n  - {name: rush, model: ssd, slo_ms: 2, rate_rps: 10}\n")
    code, _, err = run(capsys, "plan", str(path))
    assert code == 2 and "workload 'rush'" in err and "needs at least" in err


def test_gpu_type_without_profile_and_bad_profile_values_are_refused(capsys, tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(
        "gpu_types:\n  - {name: A100, price_per_hour: 4.1}\n"
        "workloads:\n  - {name: a, model: vgg19, slo_ms: 60, rate_rps: 100}\n"
    )
    code, _, err = run(capsys, "plan", str(path))
    assert code == 2 and "('A100') has no profile" in err
    data = profile_to_dict(bundled_profile())
    data["gpu"]["share_step_pct"] = 0
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps(data))
    code, _, err = run(capsys, "plan", "--profile", str(bad))
    assert code == 2 and "'share_step_pct' must be a positive number" in err


def test_plan_with_a_profile_takes_models_only_that_profile_knows(capsys, tmp_path):
    """The workload file is checked against --profile, not the bundled V100 profile first."""
    workloads = tmp_path / "cpu.yaml"
    workloads.write_text("workloads:\n  - {name: web, model: mlp_small, slo_ms: 60, rate_rps: 20}\n")
    profile = bundled_raw_path().parent / "cpu-2core-profile.json"
    code, out, err = run(capsys, "plan", str(workloads), "--profile", str(profile))
    assert code == 0, err
    assert "web" in out and "mlp_small" in out
    code, _, err = run(capsys, "plan", str(workloads))
    assert code == 2 and "model 'mlp_small' is not profiled" in err


def test_a_profile_plans_on_its_own_device_and_a_type_named_otherwise_is_warned_of(capsys, tmp_path):
    """`stoke plan FILE --profile a100.json` on a file without gpu_types plans A100s, not "V100"s with A100 figures;
    a GPU type given a profile measured on another device plans, with a warning that names both."""
    data = profile_to_dict(bundled_profile())
    data["gpu"]["name"] = "A100"
    a100 = tmp_path / "a100.json"
    a100.write_text(json.dumps(data))
    workloads = tmp_path / "w.yaml"
    workloads.write_text("workloads:\n  - {name: web, model: resnet50, slo_ms: 40, rate_rps: 400}\n")
    code, out, err = run(capsys, "plan", str(workloads), "--profile", str(a100), "--json")
    assert code == 0 and "warning" not in err, err
    assert {g["gpu_type"] for g in json.loads(out)["gpus"]} == {"A100"}
    typed = tmp_path / "typed.yaml"
    typed.write_text(f"gpu_types: [{{name: V100, price_per_hour: 3.06, profile: {a100}}}]\n" + workloads.read_text())
    code, out, err = run(capsys, "plan", str(typed), "--json")
    assert code == 0 and {g["gpu_type"] for g in json.loads(out)["gpus"]} == {"V100"}
    assert "GPU type 'V100' plans with a profile measured on 'A100'" in err, err
    code, _, err = run(capsys, "plan", str(workloads))  # the bundled profile on its own device: nothing to say
    assert code == 0 and "warning" not in err, err


def test_the_cpu_example_plans_the_demo_models(capsys, tmp_path):
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "examples" / "cpu-demo.yaml"
    code, out, err = run(capsys, "plan", str(example), "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert {w["model"] for g in plan["gpus"] for w in g["workloads"]} == {"mlp_small", "conv_medium"}
    assert plan["slo_misses"] == [] and {g["gpu_type"] for g in plan["gpus"]} == {"cpu-2core"}
    (tmp_path / "plan.json").write_text(out)  # replayed on the bundled CPU profile it records, found alone
    code, out, err = run(capsys, "simulate", str(tmp_path / "plan.json"), "--seconds", "1", "--min-requests", "0")
    assert code == 0 and "mlp_small" not in err, err


def test_the_cpu_example_s_own_commands_leave_the_bundled_repository_as_it_is(capsys, tmp_path, monkeypatch):
    """The commands in examples/cpu-demo.yaml's comment, run as written, do not rewrite triton_repo's configs."""
    import shlex
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    repo = tmp_path / "triton_repo"  # a copy stands in for the bundled one: a failing run must not dirty the checkout
    shutil.copytree(root / "triton_repo", repo)
    configs = {p: p.read_bytes() for p in repo.glob("*/config.pbtxt")}
    lines = [
        line.lstrip("# ").strip()
        for line in (root / "examples" / "cpu-demo.yaml").read_text().splitlines()
        if line.lstrip("# ").startswith("stoke ")
    ]
    assert any(line.startswith("stoke triton render") for line in lines)
    monkeypatch.chdir(root)
    plan_path = tmp_path / "plan.json"
    for line in lines:
        argv = shlex.split(line.replace("plan.json", str(plan_path)).replace("triton_repo", str(repo)))[1:]
        if argv[:2] == ["triton", "up"] or argv[:1] == ["up"]:
            continue  # serving runs until Ctrl-C or for its --seconds (tested elsewhere)
        if ">" in argv:  # the plan goes to a file
            argv = argv[: argv.index(">")]
            code, out, err = run(capsys, *argv)
            plan_path.write_text(out)
        else:
            code, out, err = run(capsys, *argv)
        assert code == 0, (line, err)
    assert {p: p.read_bytes() for p in configs} == configs


def test_fail_on_miss_exits_3_when_a_workload_is_predicted_or_simulated_late(capsys, tmp_path):
    # iGniter runs replicas near saturation: under Poisson arrivals its p99 misses
    code, out, err = run(capsys, "plan", "--strategy", "igniter", "--json", "--fail-on-miss")
    assert code == 3 and "predicted to miss their SLO" in err
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    code, _, err = run(capsys, "simulate", str(plan), "--seconds", "2", "--min-requests", "0", "--fail-on-miss")
    assert code == 3 and "over their SLO in simulation" in err
    code, out, _ = run(capsys, "plan", "--fail-on-miss")  # stoke's plan of the same workloads holds
    assert code == 0
    # with --compare it is the plan compared first that counts (it returned 0 before checking)
    code, _, err = run(capsys, "plan", "--compare", "--strategy", "igniter", "--fail-on-miss")
    assert code == 3 and "predicted to miss their SLO" in err
    code, _, _ = run(capsys, "plan", "--compare", "--fail-on-miss")
    assert code == 0


def test_an_empty_explain_and_repeated_gpu_types_are_refused_by_name(capsys, tmp_path):
    code, _, err = run(capsys, "plan", "--explain", "")
    assert code == 2 and "--explain: no workload ''" in err  # it was ignored: the plan printed with no explanation
    path = tmp_path / "w.yaml"
    path.write_text(
        "gpu_types: [{name: V100, price_per_hour: 3}, {name: V100, price_per_hour: 2}]\n"
        "workloads: [{name: a, model: alexnet, slo_ms: 15, rate_rps: 100}]\n"
    )
    code, _, err = run(capsys, "plan", str(path))
    assert code == 2 and "must be unique; repeated: V100" in err, err


@pytest.mark.slow
def test_plot_of_a_large_plan_is_a_summary_plus_pages(capsys, tmp_path):
    from planner.solver import Problem, solve
    from planner.solver.random_mix import random_workloads
    from planner.workload_file import default_gpu_types
    from stoke.plots import DETAIL_GPUS, plot_plan

    plan = solve(Problem(random_workloads(60, seed=4), default_gpu_types()), "stoke")
    assert plan.gpu_count > DETAIL_GPUS
    written = plot_plan(plan, str(tmp_path / "big.png"))
    pages = -(-plan.gpu_count // DETAIL_GPUS)
    assert len(written) == 1 + pages and written[1].endswith("big-gpus-1.png")
    assert all((tmp_path / name.split("/")[-1]).read_bytes()[:4] == b"\x89PNG" for name in written)


def test_simulate_bounds_its_run_length(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", "--json")
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    for option, value, message in (
        ("--seconds", "1e9", "--seconds must be in"),
        ("--min-requests", "-1", "--min-requests must be in"),
        ("--seed", "-1", "--seed must be a whole number from 0"),
    ):
        code, _, err = run(capsys, "simulate", str(plan), option, value)
        assert code == 2 and message in err


def test_profile_show_reports_the_domain_and_error(capsys):
    code, out, _ = run(capsys, "profile", "show")
    assert code == 0 and "LOO_err_p90" in out and "10,50,100" in out
    code, out, _ = run(capsys, "profile", "show", "--json")
    data = json.loads(out)
    assert data["models"]["ssd"]["batches"] == [1, 16, 32] and 0 < data["models"]["ssd"]["error_floor"] < 0.2
    # the bound off the measured points: the floor and what they cannot show, as the planner uses it
    ssd = data["models"]["ssd"]
    assert ssd["unmeasured_error"] == UNMEASURED_ERROR
    assert ssd["unmeasured_bound"] == pytest.approx(ssd["error_floor"] + UNMEASURED_ERROR, abs=1e-6)
    code, out, _ = run(capsys, "profile", "show")
    row = next(line.split() for line in out.splitlines() if line.startswith("ssd "))
    assert "unmeasured" in out and row[6] == f"{ssd['error_floor'] + UNMEASURED_ERROR:.1%}"
    assert float(bundled_profile().model("ssd").fit_error(8, 30.0)) >= ssd["error_floor"] + UNMEASURED_ERROR - 1e-9


def test_profile_show_reports_the_measured_serving_path(capsys):
    cpu_profile = str(bundled_raw_path().parent / "cpu-2core-profile.json")
    code, out, _ = run(capsys, "profile", "show", cpu_profile, "--json")
    data = json.loads(out)
    assert code == 0 and all(m["serving_p99_ms"] > 0 for m in data["models"].values())
    assert all(m["beyond_sli_p99_ms"] >= 0 for m in data["models"].values())
    code, out, _ = run(capsys, "profile", "show", cpu_profile)
    assert "serving_p99_ms" in out and "beyond_sli_ms" in out and "not measured" not in out
    code, out, _ = run(capsys, "profile", "show")  # the bundled V100 figures carry no serving path
    assert "0 (not measured)" in out
    code, out, _ = run(capsys, "profile", "show", "--json")  # nor anything beyond the SLI: the default
    assert all(m["beyond_sli_p99_ms"] == 0.0 for m in json.loads(out)["models"].values())


def test_profile_verify_measures_the_plans_points_and_replans(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", "--json")
    (tmp_path / "plan.json").write_text(out)
    code, out, _ = run(
        capsys, "profile", "verify", str(tmp_path / "plan.json"), "--plan-out", str(tmp_path / "verified.json")
    )
    assert code == 0 and "round 1: measured" in out and "holds on measured points" in out
    verified = json.loads((tmp_path / "verified.json").read_text())
    assert all(w["p99_upper_ms"] <= w["slo_ms"] for g in verified["gpus"] for w in g["workloads"])
    # it records the profile with the measured points (--profile-out's), not the bundled one it started from
    planned = json.loads((tmp_path / "plan.json").read_text())["profiles"]["V100"]
    assert len(verified["profiles"]["V100"]) == 64 and verified["profiles"]["V100"] != planned


def test_plan_explain_says_which_bound_binds_and_the_domain(capsys):
    code, out, _ = run(capsys, "plan", "--json")
    name = json.loads(out)["gpus"][0]["workloads"][0]["name"]
    code, out, _ = run(capsys, "plan", "--explain", name)
    assert code == 0 and "error bound" in out and "domain: measured shares 10-100%" in out and "binding:" in out


def test_plan_explain_says_whether_the_chosen_point_was_measured(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", "--json")
    (tmp_path / "plan.json").write_text(out)
    name = json.loads(out)["gpus"][0]["workloads"][0]["name"]
    code, out, _ = run(capsys, "plan", "--explain", name)
    assert code == 0 and f"+{UNMEASURED_ERROR:.0%} at a point it did not measure" in out
    assert "(not measured: " in out  # the bundled example's points are between the fit's
    # verified: the chosen points were measured, the bound there is the measurement's own
    code, _, _ = run(
        capsys,
        "profile",
        "verify",
        str(tmp_path / "plan.json"),
        "--plan-out",
        str(tmp_path / "v.json"),
        "--profile-out",
        str(tmp_path / "measured.json"),
    )
    assert code == 0
    code, out, _ = run(capsys, "plan", "--profile", str(tmp_path / "measured.json"), "--explain", name)
    assert code == 0 and "(measured by verification)" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--plot", "{tmp}/p.txt"], "the file must end in .png, .svg, .pdf"),
        (["plan", "--plot", "{tmp}/noext"], "the file must end in .png"),
        (["plan", "--plot", "{tmp}"], "is a directory; give a file inside it"),
        (["profile", "verify", "plan.json", "--plan-out", "{tmp}"], "is a directory"),
        (["profile", "verify", "plan.json", "--profile-out", "{tmp}/nowhere/p.json"], "does not exist; create it"),
        (["profile", "fit", "-", "-o", "{tmp}"], "is a directory"),
        (["plan", "--plot", "{tmp}/\x1b[2Jp.png"], "is not a file name"),
    ],
)
def test_output_paths_are_checked_before_any_work(capsys, tmp_path, argv, message):
    # a path that cannot be written fails at once (exit 2), not after a verification's rounds
    with pytest.raises(SystemExit) as caught:
        main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and message in err and "Traceback" not in err and "\x1b[2J" not in err
    assert not (tmp_path / "nowhere").exists()


def test_verify_never_writes_over_the_plan_it_verifies_nor_to_a_file_named_as_a_format(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", "--json")
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    code, _, err = run(capsys, "profile", "verify", str(plan), "--profile-out", str(plan))
    assert code == 2 and "is the plan being verified" in err and json.loads(plan.read_text()) == json.loads(out)
    code, _, err = run(capsys, "profile", "verify", str(plan), "--plan-out", "json")
    assert code == 2 and "'json' is an output format here; give a file (./json" in err


def test_a_device_or_fifo_is_not_replaced_by_an_output(capsys, tmp_path):
    # a write goes through a temp file and a rename: as root, --plan-out /dev/null would replace /dev/null
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(SystemExit):
        main(["profile", "verify", "plan.json", "--plan-out", str(fifo)])
    assert "is not a regular file" in capsys.readouterr().err and stat.S_ISFIFO(fifo.stat().st_mode)


def test_profile_fit_does_not_write_over_its_own_input(capsys, tmp_path):
    raw = tmp_path / "raw.jsonl"
    raw.write_text(bundled_raw_path().read_text())
    code, _, err = run(capsys, "profile", "fit", str(raw), "-o", str(raw))
    assert code == 2 and "is the measurements file itself" in err
    assert raw.read_text() == bundled_raw_path().read_text()


def test_plot_explain_and_wide_are_refused_beside_compare(capsys, tmp_path):
    code, _, err = run(capsys, "plan", "--compare", "--plot", str(tmp_path / "c.png"))
    assert code == 2 and "--plot is about one plan and --compare prints a comparison" in err
    assert not (tmp_path / "c.png").exists()
    code, _, err = run(capsys, "plan", "--compare", "-o", "wide")
    assert code == 2 and "--compare has no wide table" in err


def test_verify_refuses_one_file_for_both_outputs(capsys, tmp_path):
    same = str(tmp_path / "out.json")
    code, _, err = run(capsys, "profile", "verify", "plan.json", "--plan-out", same, "--profile-out", same)
    assert code == 2 and "both name" in err


def test_unstable_replicas_are_explained_and_counted_apart(capsys):
    # iGniter's rule plans some replicas of the bundled example past their throughput
    code, out, _ = run(capsys, "plan", "--strategy", "igniter", "--json")
    unstable = sorted(
        {w["name"] for g in json.loads(out)["gpus"] for w in g["workloads"] if w["predicted_p99_ms"] is None}
    )
    code, out, _ = run(capsys, "plan", "--strategy", "igniter")
    summary = next(line for line in out.splitlines() if line.startswith("predicted p99/SLO"))
    assert code == 0 and unstable and f"(and {len(unstable)} unstable: {', '.join(unstable)})" in summary
    assert "unstable: the requests arrive faster than the replica serves them" in out


def test_simulate_refuses_a_run_of_more_requests_than_it_can_hold(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", "--json")
    (tmp_path / "plan.json").write_text(out)
    code, _, err = run(capsys, "simulate", str(tmp_path / "plan.json"), "--seconds", "80000")
    assert code == 2 and "more than 20,000,000; lower --seconds" in err
    # replicas too slow to send --min-requests in --seconds run longer: they count that many (8 x 3,000,000)
    code, _, err = run(capsys, "simulate", str(tmp_path / "plan.json"), "--min-requests", "3000000")
    assert code == 2 and "run to --min-requests 3,000,000), more than 20,000,000" in err, err
    assert "lower --seconds or --min-requests" in err


def test_a_format_name_after_o_is_the_format_even_beside_a_folder_of_that_name(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "json").mkdir()
    code, out, _ = run(capsys, "train", "plan", "-o", "json")
    assert code == 0 and json.loads(out)


def test_files_a_command_writes_are_checked_before_it_works_and_no_folder_is_made(capsys, tmp_path):
    """`report --out` created a missing folder tree (a typo scattered files); `token agent --file` minted first,
    revoking the node's token, then could not write the new one. Both are refused before any work; `--plot DIR`
    suggests a file with the suffix it takes."""
    missing = tmp_path / "no-such-folder"
    for argv in (
        ("report", "--out", str(missing / "r.html")),
        ("token", "agent", "n1", "--file", str(missing / "t"), "--controller", "127.0.0.1:1"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(list(argv))
        _, err = capsys.readouterr()
        assert exit_.value.code == 2 and f"folder {missing} does not exist; create it first" in err, (argv, err)
    assert not missing.exists()
    with pytest.raises(SystemExit):
        main(["plan", "--plot", str(tmp_path)])
    assert f"e.g. {tmp_path / 'out.png'}" in capsys.readouterr().err


def test_status_json_says_null_for_figures_not_known_yet():
    """proto3 sends 0 for a pending workload's prediction and attainment; the table shows "-", and the JSON said
    slo_attainment 0.0 (every request late) until it said null."""
    from controller.api import stoke_pb2 as pb
    from stoke.commands.control import status_dict

    reply = pb.StatusResponse(workloads=[pb.WorkloadStatus(name="a", model="m", slo_ms=50, state="pending")])
    (w,) = status_dict(reply)["workloads"]
    assert w["state"] == "pending" and w["slo_ms"] == 50
    for key in ("predicted_p99_ms", "predicted_latency_ms", "slo_attainment", "observed_latency_ms"):
        assert w[key] is None, key
    served = pb.WorkloadStatus(name="b", model="m", slo_ms=50, state="serving", observed=True, observed_p99_ms=20.0)
    served.replicas.add(share_pct=50)
    served.predicted_p99_ms, served.slo_attainment, served.observed_latency_ms = 18.0, 1.0, 12.0
    (w,) = status_dict(pb.StatusResponse(workloads=[served]))["workloads"]
    assert (w["predicted_p99_ms"], w["slo_attainment"], w["observed_latency_ms"]) == (18.0, 1.0, 12.0)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--ready-timeout", "0"], "--ready-timeout must be a positive number of seconds"),
        (["--ready-timeout", "nan"], "--ready-timeout must be a positive number of seconds"),
        (["--node-id", "a/b"], "--node-id must be a name"),
        (["--node-id", "n\x1b[31m"], "got 'n\\x1b[31m'"),  # shown escaped, not echoed raw
        (["--gpu-type", "a/b"], "--gpu-type must be a name"),
        (["--advertise", "a b/c"], "not a host name or address"),
        (["--sli-metrics", "s3://x/y"], "not an http(s) /metrics URL"),
        (["--log-level", "FOO"], "--log-level 'FOO': give one of debug"),
    ],
)
def test_the_agent_refuses_bad_options_before_it_starts_anything(capsys, monkeypatch, tmp_path, extra, message):
    """Each started an agent that retried forever (or raised a traceback) instead of a one-line error."""
    monkeypatch.delenv("STOKE_TOKEN", raising=False)
    argv = ["agent", "--controller", "127.0.0.1:1", "--device", "cpu", "--workdir", str(tmp_path / "w"), *extra]
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err and "\x1b" not in err, err
    assert not (tmp_path / "w").exists()


def test_profile_fit_refuses_a_bad_raw_key_at_its_line_and_plan_names_memory(capsys, tmp_path):
    raw = tmp_path / "raw.jsonl"
    raw.write_text(bundled_raw_path().read_text() + '{"hardware": {"memory_mb": 16160}}\n')
    code, _, err = run(capsys, "profile", "fit", str(raw), "-o", str(tmp_path / "p.json"))
    assert code == 2 and f"{raw}:71: section 'hardware' has unknown key 'memory_mb'" in err
    assert not (tmp_path / "p.json").exists()
    # a GPU with 1000 MiB: vgg19 needs 500 MiB of context + 548 of weights + 60 of activations at batch 1
    raw.write_text(bundled_raw_path().read_text().replace('"memory_mib": 16160', '"memory_mib": 1000'))
    assert run(capsys, "profile", "fit", str(raw), "-o", str(tmp_path / "p.json"))[0] == 0
    code, _, err = run(capsys, "plan", "--profile", str(tmp_path / "p.json"), "--explain", "visual-similar")
    assert code == 2 and "does not fit a V100's memory even alone" in err and "needs 1,108 MiB" in err
    assert "does not fit a whole" not in err
