"""The generated rules against the real promtool: `check rules` and `test rules` (fast/slow burn, healthy)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy.alerts import RULES_FILE, RULES_TEST_FILE, SloOptions, render_all, rule_tests
from planner.solver.problem import Workload
from stoke.cli import main

pytestmark = [
    pytest.mark.promtool,
    pytest.mark.skipif(
        shutil.which("promtool") is None, reason="promtool not installed: run `make tools` (Debian package prometheus)"
    ),
]

FEW = (Workload("photo-tagging", "alexnet", 15, 500), Workload("search", "resnet50", 12.5, 80))


def _write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).write_text(text)


def _promtool(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], cwd=folder, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("le_style", ["short", "float"])
def test_rule_unit_tests_pass_for_triton_and_prometheus3_le(tmp_path: Path, le_style: str):
    files = render_all(FEW)
    files[RULES_TEST_FILE] = yaml.safe_dump(rule_tests(FEW, le_style=le_style), sort_keys=False)
    _write(tmp_path, files)
    check = _promtool(tmp_path, "check", "rules", RULES_FILE)
    assert check.returncode == 0, check.stdout + check.stderr
    # and the controller's own alerts: 2 on its store, 4 on what it serves (pending, held, lost, refused floors)
    assert f"SUCCESS: {2 * (8 + 8 + 7 + 2) + 2 + 4} rules found" in check.stdout
    result = _promtool(tmp_path, "test", "rules", RULES_TEST_FILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_other_objective_passes_its_own_tests(tmp_path: Path):
    _write(tmp_path, render_all(FEW[:1], SloOptions(objective=0.99, selector='model="{name}"')))
    result = _promtool(tmp_path, "test", "rules", RULES_TEST_FILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_selector_with_every_operator_passes_its_own_tests(tmp_path: Path):
    """!= and !~ matchers stay out of the test series (a missing label matches them), a literal =~ labels them."""
    selector = 'job="stoke", model=~"{model}",workload!="{name}-old",canary!~"true|yes",q="a\\"b{{1}}"'
    _write(tmp_path, render_all(FEW, SloOptions(selector=selector)))
    check = _promtool(tmp_path, "check", "rules", RULES_FILE)
    assert check.returncode == 0, check.stdout + check.stderr
    result = _promtool(tmp_path, "test", "rules", RULES_TEST_FILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_wrong_burn_rates_make_the_unit_tests_fail(tmp_path: Path):
    files = render_all(FEW[:1])
    # a page threshold ten times too high no longer pages on the fast burn
    files[RULES_FILE] = (
        files[RULES_FILE].replace("(14.4 * 0.001)", "(144 * 0.001)").replace("(6 * 0.001)", "(60 * 0.001)")
    )
    _write(tmp_path, files)
    result = _promtool(tmp_path, "test", "rules", RULES_TEST_FILE)
    assert result.returncode != 0
    assert "StokeLatencySLOBurnPage" in result.stdout + result.stderr


def test_a_page_expected_on_a_healthy_series_fails(tmp_path: Path):
    files = render_all(FEW[:1])
    tests = yaml.safe_load(files[RULES_TEST_FILE])
    healthy = tests["tests"][2]
    fast_page = tests["tests"][0]["alert_rule_test"][0]
    healthy["alert_rule_test"][0]["exp_alerts"] = fast_page["exp_alerts"]
    files[RULES_TEST_FILE] = yaml.safe_dump(tests, sort_keys=False)
    _write(tmp_path, files)
    result = _promtool(tmp_path, "test", "rules", RULES_TEST_FILE)
    assert result.returncode != 0


def test_cli_renders_bundled_example_and_checks_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "out"
    assert main(["alerts", "render", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "photo-tagging" in text and "written" in text
    assert main(["alerts", "check", str(out)]) == 0
    report = capsys.readouterr().out
    assert "promtool check rules prometheus-rules.yml      ok" in report
    assert "promtool test rules prometheus-rules.test.yml  ok" in report
    # idempotent: a second render changes nothing
    assert main(["alerts", "render", "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["files"].values()) == {"unchanged"}


def test_cli_check_reports_a_broken_rule_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    _write(tmp_path, render_all(FEW[:1]))
    (tmp_path / RULES_FILE).write_text("groups:\n- name: x\n  rules:\n  - record: a\n    expr: sum(\n")
    assert main(["alerts", "check", str(tmp_path)]) == 1
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "triton_selector, keeps_apart",
    [
        (SloOptions().triton_selector, True),
        ('model="{model}"', False),  # Triton's own labels only: the two workloads mix
    ],
)
def test_triton_panels_of_workloads_sharing_a_model_do_not_mix(tmp_path: Path, triton_selector: str, keeps_apart: bool):
    """Real promtool evaluates the dashboard rules: two workloads serve alexnet from their own Triton
    processes (scraped with a workload target label) at 2 and 6 req/s, batches of 4 and 2."""
    shared = (Workload("photo-tagging", "alexnet", 15, 500), Workload("thumbnail-filter", "alexnet", 10, 1200))
    _write(tmp_path, render_all(shared, SloOptions(triton_selector=triton_selector)))
    # per minute: (requests, batch executions); expected (req/s, mean batch)
    traffic = {"photo-tagging": ((120, 30), (2, 4)), "thumbnail-filter": ((360, 180), (6, 2))}
    series = []
    for name, ((requests, execs), _) in traffic.items():
        labels = f'model="alexnet",version="1",workload="{name}",instance="{name}:8002"'
        series += [
            {"series": f"nv_inference_request_success{{{labels}}}", "values": f"0+{requests}x20"},
            {"series": f"nv_inference_count{{{labels}}}", "values": f"0+{requests}x20"},
            {"series": f"nv_inference_exec_count{{{labels}}}", "values": f"0+{execs}x20"},
        ]
    checks = [
        {
            "expr": f'workload:{metric}{{workload="{name}"}}',
            "eval_time": "10m",
            "exp_samples": [
                {"labels": f'workload:{metric}{{model="alexnet",workload="{name}"}}', "value": expected[i]}
            ],
        }
        for name, (_, expected) in traffic.items()
        for i, metric in enumerate(("nv_inference_request_success:rate5m", "nv_inference_batch_size:mean5m"))
    ]
    tests = {
        "rule_files": [RULES_FILE],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": checks}],
    }
    (tmp_path / "mix.test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    result = _promtool(tmp_path, "test", "rules", "mix.test.yml")
    assert (result.returncode == 0) == keeps_apart, result.stdout + result.stderr


def test_a_pending_alert_that_waits_too_long_fails_its_unit_test(tmp_path: Path):
    files = render_all(FEW[:1])
    assert "for: 5m" in files[RULES_FILE]
    files[RULES_FILE] = files[RULES_FILE].replace("for: 5m", "for: 30m", 1)  # StokeWorkloadPending, first rule
    _write(tmp_path, files)
    result = _promtool(tmp_path, "test", "rules", RULES_TEST_FILE)
    assert result.returncode != 0 and "StokeWorkloadPending" in result.stdout + result.stderr
