"""`stoke alerts render` options and errors (no promtool needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from planner.solver.problem import GpuPlan, Placement, Plan, plan_to_dict
from stoke.cli import main

WORKLOADS_YAML = """workloads:
  - {name: photo-tagging, model: alexnet, slo_ms: 15, rate_rps: 500}
  - {name: search, model: resnet50, slo_ms: 40, rate_rps: 100}
"""


def test_render_with_file_objective_selector_and_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    wl = tmp_path / "w.yaml"
    wl.write_text(WORKLOADS_YAML)
    plan = Plan("stoke", (GpuPlan("V100", 3.06, (Placement("search", "resnet50", 40, 100, 60.0, 4, 1.0, 9.0, 300),)),))
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan_to_dict(plan)))
    out = tmp_path / "out"
    rc = main(
        [
            "alerts",
            "render",
            str(wl),
            "--out",
            str(out),
            "--objective",
            "99",
            "--selector",
            'model="{name}"',
            "--plan",
            str(plan_file),
            "--histogram",
            "stoke_request_latency_ms",
            "--json",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert [w["workload"] for w in doc["workloads"]] == ["photo-tagging", "search"]
    assert doc["shared_selectors"] == {}
    rules = (out / "prometheus-rules.yml").read_text()
    assert 'stoke_request_latency_ms_bucket{model="search",le=~`40(\\.0)?`}' in rules
    assert "(14.4 * 0.01)" in rules
    dash = json.loads((out / "grafana-dashboard.json").read_text())
    [content] = [p for p in dash["panels"] if p["type"] == "text"]
    assert "| search | 0/1 | gpu-0 | 0 | V100 | 60 | 4 |" in content["options"]["content"]
    assert dash["uid"] == "stoke-slo"
    assert yaml.safe_load((out / "grafana-alerts.yml").read_text())["apiVersion"] == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--objective", "100"], "--objective must be a percentage"),
        (["--selector", 'model="{oops}"'], "selector"),
        (["--histogram", "not a metric"], "not a Prometheus metric name"),
        (["--dashboard-uid", "a/b"], "dashboard uid 'a/b' must be 1-40 characters"),
        (["--triton-selector", 'job="{nope}"'], "--triton-selector"),
        (["--plan", "/nonexistent/plan.json"], "cannot read plan"),
    ],
)
def test_bad_options_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv, message):
    assert main(["alerts", "render", "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("stoke: error:") and message in err and "\n" not in err


@pytest.mark.parametrize(
    "flag, value, says",
    [
        ("--selector", "foo", "not a list of label matchers"),  # was written as `_bucket{foo,le=~...}`, exit 0
        ("--selector", 'a="}"', "a literal brace is written {{ or }}"),  # was Python's format error
        ("--selector", "{model}", "not a list of label matchers"),
        ("--selector", 'workload="{name}",', "drop the trailing comma"),
        ("--selector", '{workload="{name}"}', "without the braces"),
        ("--selector", "model={model}", "a quoted value"),
        ("--selector", 'model=="{model}"', "one of = != =~ !~"),
        ("--selector", 'job="a"  model="{model}"', "at 'model=\"{model}\"'"),
        ("--selector", 'x="\x1b[31m"', "'x=\"\\x1b[31m\"'"),  # a control character is shown escaped
        ("--selector", "", "got none"),
        ("--triton-selector", 'job="{nope}"', "may use only the placeholders {model} and {name}, got '{nope}'"),
        ("--triton-selector", "job", "not a list of label matchers"),
    ],
)
def test_a_selector_that_is_not_label_matchers_is_refused_with_the_flag_and_an_example(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, says: str
):
    assert main(["alerts", "render", "--out", str(tmp_path / "o"), flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"stoke: error: {flag} ") and says in err and "\n" not in err and "\x1b" not in err
    default = 'workload="{name}"' if flag == "--selector" else 'model="{model}",workload="{name}"'
    assert err.endswith(f"e.g. {flag} '{default}' (the default)")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "selector, series",
    [
        ('job="stoke",model="{model}"', 'job="stoke",model="resnet50",le=~'),
        (' job = "stoke" , model!="x"', ' job = "stoke" , model!="x",le=~'),
        (
            'model=~"{model}|x{{2}}\\\\.y",workload!~"{name}-old"',
            'model=~"resnet50|x{2}\\\\.y",workload!~"search-old",le=~',
        ),
        ('job="a\\"b"', 'job="a\\"b",le=~'),
    ],
)
def test_label_matchers_with_every_operator_placeholders_and_escapes_are_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], selector: str, series: str
):
    wl = tmp_path / "w.yaml"
    wl.write_text(WORKLOADS_YAML)
    assert main(["alerts", "render", str(wl), "--out", str(tmp_path / "o"), "--selector", selector]) == 0
    capsys.readouterr()
    groups = yaml.safe_load((tmp_path / "o" / "prometheus-rules.yml").read_text())["groups"]
    assert f"stoke_request_latency_ms_bucket{{{series}" in " ".join(r["expr"] for g in groups for r in g["rules"])


def test_bad_workload_file_and_foreign_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    bad = tmp_path / "bad.yaml"
    bad.write_text("workloads:\n  - {name: a, model: alexnet, slo_ms: -1, rate_rps: 5}\n")
    assert main(["alerts", "render", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "slo_ms" in capsys.readouterr().err
    wl = tmp_path / "w.yaml"
    wl.write_text(WORKLOADS_YAML)
    plan = Plan("stoke", (GpuPlan("V100", 3.06, (Placement("other", "vgg19", 40, 10, 50, 1, 0, 9, 30),)),))
    (tmp_path / "p.json").write_text(json.dumps(plan_to_dict(plan)))
    assert main(["alerts", "render", str(wl), "--out", str(tmp_path / "o"), "--plan", str(tmp_path / "p.json")]) == 2
    assert "plan places workloads not in the workload file, or with another model (other)" in capsys.readouterr().err
    # a plan of other workloads under the same names (examples/cpu-demo.yaml reuses the example's): refused too
    name = yaml.safe_load(WORKLOADS_YAML)["workloads"][0]["name"]
    other = Plan("stoke", (GpuPlan("V100", 3.06, (Placement(name, "not_its_model", 40, 10, 50, 1, 0, 9, 30),)),))
    (tmp_path / "p.json").write_text(json.dumps(plan_to_dict(other)))
    assert main(["alerts", "render", str(wl), "--out", str(tmp_path / "o"), "--plan", str(tmp_path / "p.json")]) == 2
    assert f"or with another model ({name})" in capsys.readouterr().err
    # a datasource uid Grafana cannot have went into every alert rule ('' included)
    for uid in ("", "a b", 'x"y'):
        assert main(["alerts", "render", str(wl), "--out", str(tmp_path / "o"), "--datasource-uid", uid]) == 2
        assert "datasource uid" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["alerts", "render", str(wl), "--out", str(tmp_path / "file")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_help_states_the_real_defaults(capsys: pytest.CaptureFixture[str]):
    from deploy.alerts import SloOptions

    with pytest.raises(SystemExit):
        main(["alerts", "render", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert SloOptions().selector == 'workload="{name}"'
    selector_help = text.split("--selector MATCHERS")[-1].split("--triton-selector")[0]
    assert "(default: 'workload=\"{name}\"')" in selector_help and 'model="{model}"' not in selector_help


def test_dashboard_uid_and_triton_selector_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "out"
    assert (
        main(
            [
                "alerts",
                "render",
                "--out",
                str(out),
                "--dashboard-uid",
                "prod-slo",
                "--triton-selector",
                'job="triton",workload="{name}"',
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert json.loads((out / "grafana-dashboard.json").read_text())["uid"] == "prod-slo"
    assert (
        'nv_inference_exec_count{job="triton",workload="photo-tagging"}' in (out / "prometheus-rules.yml").read_text()
    )


def test_grafana_alerts_take_the_datasource_uid_and_say_the_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """grafana-alerts.yml queries --datasource-uid; left at its default, render and the file both say so."""

    def uids(folder: Path) -> set[str]:
        groups = yaml.safe_load((folder / "grafana-alerts.yml").read_text())["groups"]
        return {q["datasourceUid"] for g in groups for r in g["rules"] for q in r["data"]} - {"__expr__"}

    default = tmp_path / "default"
    assert main(["alerts", "render", "--out", str(default)]) == 0
    out = capsys.readouterr().out
    assert uids(default) == {"prometheus"}
    assert "uid 'prometheus' (the default)" in out and "--datasource-uid UID" in out
    assert "uid 'prometheus' (the default)" in (default / "grafana-alerts.yml").read_text()
    mine = tmp_path / "mine"
    assert main(["alerts", "render", "--out", str(mine), "--datasource-uid", "P1809F7CD0C75ACF3"]) == 0
    out = capsys.readouterr().out
    assert uids(mine) == {"P1809F7CD0C75ACF3"} and "(the default)" not in out
    assert "uid 'P1809F7CD0C75ACF3'" in (mine / "grafana-alerts.yml").read_text()
    dashboard = json.loads((mine / "grafana-dashboard.json").read_text())
    picker = next(v for v in dashboard["templating"]["list"] if v["name"] == "datasource")
    assert picker["current"]["value"] == "P1809F7CD0C75ACF3"
